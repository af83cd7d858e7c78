//! A progress bar on stderr, drawn only when stderr is a terminal
//! (indicatif hides it otherwise), redrawn at most 20 times a second.

pub struct Progress {
    bar: indicatif::ProgressBar,
}

impl Progress {
    /// A bar of bytes: done / total, rate, time left.
    pub fn new(what: &'static str) -> Progress {
        Progress::with_template(
            what,
            "{msg}: {bytes}/{total_bytes} [{wide_bar}] {bytes_per_sec}, {eta} left",
        )
    }

    /// A bar of items (`unit`: what they are, e.g. "segments").
    pub fn counting(what: &'static str, unit: &str) -> Progress {
        let template = format!("{{msg}}: {{pos}}/{{len}} {unit} [{{wide_bar}}] {{eta}} left");
        Progress::with_template(what, &template)
    }

    fn with_template(what: &'static str, template: &str) -> Progress {
        let bar = indicatif::ProgressBar::with_draw_target(
            None,
            indicatif::ProgressDrawTarget::stderr_with_hz(20),
        );
        let style = indicatif::ProgressStyle::with_template(template)
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
        bar.set_style(style);
        bar.set_message(what);
        Progress { bar }
    }

    pub fn show(&self, done: u64, total: u64) {
        self.bar.set_length(total);
        self.bar.set_position(done);
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
