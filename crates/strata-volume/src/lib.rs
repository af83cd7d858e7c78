//! Volume engine.
