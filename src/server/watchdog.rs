//! One stream's watchdog: it cuts the connection of a client that takes nothing, wherever the
//! stream itself waits (for room in the budget, for its channel, for the run's next change).
//! A stream that waits for room while its client holds room untaken would otherwise keep that
//! room for as long as the budget stays full, and every other stream waiting with it: a few
//! clients that read nothing would stop every stream of the replica.
//!
//! The cut loses the client nothing: it reconnects with its cursor.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::held::{EventBudget, Tally};
use crate::serving::cut::ConnectionCut;

/// While other streams wait for room in the budget, a client that holds room and has taken
/// nothing for this long is cut (a reader on a slow link takes a segment in a second or two).
pub const PRESSED_PATIENCE: Duration = Duration::from_secs(5);
/// How often the watchdog looks, at most.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// What the watchdog of one stream looks at, and the switch it throws.
pub struct Watchdog {
    tally: Arc<Tally>,
    budget: EventBudget,
    cut: Arc<watch::Sender<bool>>,
    connection: Option<ConnectionCut>,
    /// How long a client may take nothing while no other stream waits for room.
    patience: Duration,
}

impl Watchdog {
    pub fn new(
        tally: Arc<Tally>,
        budget: EventBudget,
        cut: Arc<watch::Sender<bool>>,
        connection: Option<ConnectionCut>,
        patience: Duration,
    ) -> Self {
        Self {
            tally,
            budget,
            cut,
            connection,
            patience,
        }
    }

    /// Runs `stream` until it ends, or until this watchdog cuts its client (the stream is
    /// then dropped wherever it waits).
    pub async fn beside<F: std::future::Future>(self, stream: F) {
        tokio::select! {
            _ = stream => {}
            () = self.until_cut() => {}
        }
    }

    /// Returns once it has cut the client's connection; never, while the client keeps up.
    async fn until_cut(self) {
        let mut checks = tokio::time::interval((self.patience / 4).min(CHECK_EVERY));
        loop {
            checks.tick().await;
            if self.too_slow() {
                tracing::info!(patience = ?self.patience, "a stream's client took nothing: cut");
                // The body's cut ends the stream where hyper still polls it; the connection's
                // ends it where hyper waits on a socket the client no longer reads.
                self.cut.send_replace(true);
                if let Some(connection) = &self.connection {
                    connection.cut();
                }
                return;
            }
        }
    }

    fn too_slow(&self) -> bool {
        let pressed = self.patience.min(PRESSED_PATIENCE);
        self.tally.stalled(self.patience) || (self.budget.pressed() && self.tally.stalled(pressed))
    }
}
