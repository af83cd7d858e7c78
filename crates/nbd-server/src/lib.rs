//! NBD server core: listeners, fixed-newstyle handshake, option haggling and
//! the pipelined transmission loop. Generic over [`ExportProvider`]; it knows
//! no storage engine.

mod device;

pub use device::{Allocation, BlockDevice, BlockSizes, ExportInfo, ExportProvider, Extent, ZeroFlags};
