//! What the tests that keep passwords out of sight share: hostile
//! passwords, and a capture of everything `tracing` writes.
//!
//! Every password here is `Zq7<characters>Wv3`, so that a leak of any piece
//! of it, whole or cut at one of its characters, shows as `Zq7` or `Wv3`.

use std::io::Write;
use std::sync::{Arc, Mutex, PoisonError, Weak};

/// Everything `tracing` writes while it is installed, at every level.
#[derive(Clone, Debug, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    /// What was written so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(PoisonError::into_inner)).into_owned()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The buffers of the captures alive now, which the process-wide
/// subscriber writes the other threads' traces to.
static LIVE: Mutex<Vec<Weak<Mutex<Vec<u8>>>>> = Mutex::new(Vec::new());

fn live() -> std::sync::MutexGuard<'static, Vec<Weak<Mutex<Vec<u8>>>>> {
    LIVE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Writes to every live capture.
struct EveryCapture;

impl Write for EveryCapture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut live = live();
        live.retain(|buffer| buffer.strong_count() > 0);
        for buffer in live.iter().filter_map(Weak::upgrade) {
            buffer
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend_from_slice(buf);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Captures every trace until the guard is dropped, at every level, and
/// every `log` record the drivers write: this thread's (a current-thread
/// runtime's tasks included), and those of every other thread, the
/// library's own (its renewals run on a thread of their own) and the
/// drivers' included. With other captures alive in the process (tests
/// run side by side), another thread's traces go to each of them: a
/// password there is a leak whoever finds it.
pub fn capture_tracing() -> (Captured, tracing::subscriber::DefaultGuard) {
    static PROCESS_WIDE: std::sync::Once = std::sync::Once::new();
    PROCESS_WIDE.call_once(|| {
        use tracing_subscriber::Layer;
        use tracing_subscriber::layer::SubscriberExt;
        // Formats nothing while no capture is alive.
        let every_capture = tracing_subscriber::fmt::layer()
            .with_writer(|| EveryCapture)
            .with_ansi(false)
            .with_filter(tracing_subscriber::filter::filter_fn(|_| {
                live().iter().any(|buffer| buffer.strong_count() > 0)
            }));
        // The process's one subscriber for threads without their own; a
        // program that set one first keeps it.
        let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry().with(every_capture));
    });
    // The process's one logger: it hands each record to its thread's
    // subscriber. Set already by an earlier capture in this process.
    let _ = tracing_log::LogTracer::init();
    let captured = Captured::default();
    live().push(Arc::downgrade(&captured.0));
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    (captured, tracing::subscriber::set_default(subscriber))
}

/// Passwords that break naive URL handling: `Zq7<c>Wv3` for every printable
/// ASCII character `c`, and one holding all of them.
pub fn hostile_passwords() -> Vec<String> {
    let mut passwords: Vec<String> = (0x20u8..0x7f)
        .map(|c| format!("Zq7{}Wv3", char::from(c)))
        .collect();
    passwords.push(format!(
        "Zq7{}Wv3",
        (0x20u8..0x7f).map(char::from).collect::<String>()
    ));
    passwords
}

/// The characters that end a URL's userinfo or start an escape (`@`, `/`,
/// `#`, `?`, `:`, `%`), each alone in a password, and all of them in one:
/// what a generated password holds and what a URL parser misreads.
pub fn url_passwords() -> Vec<String> {
    ["@", "/", "#", "?", ":", "%", "@/#?:%"]
        .iter()
        .map(|c| format!("Zq7{c}Wv3"))
        .collect()
}

/// Fails if `text` holds any piece of a password made by this module.
pub fn assert_no_password(what: &str, text: &str) {
    assert!(
        !text.contains("Zq7") && !text.contains("Wv3"),
        "{what}: a password fragment leaked: {text}"
    );
}

/// No trace line captured and no metric label recorded holds a piece of a
/// password, and something was traced and labelled (else the check saw
/// nothing).
pub fn assert_nothing_shown(captured: &Captured, metrics: &metrics_util::debugging::Snapshotter) {
    let traced = captured.text();
    assert_no_password("tracing output", &traced);
    assert!(!traced.is_empty(), "nothing was traced: the check saw nothing");
    let labels: String = metrics
        .snapshot()
        .into_vec()
        .into_iter()
        .flat_map(|(key, ..)| {
            key.key()
                .labels()
                .map(|l| format!("{}={}\n", l.key(), l.value()))
                .collect::<Vec<_>>()
        })
        .collect();
    assert_no_password("metric labels", &labels);
    assert!(
        !labels.is_empty(),
        "no metric was labelled: the check saw nothing"
    );
}
