//! A transaction held open on a Postgres handle of its own, its locks with it, for as
//! long as a test needs: a takeover caught mid-commit, a lease row no renewal gets
//! through, an advisory lock that gates a trigger.

/// Runs `sql` (its one parameter `param`) in a write on a handle of its own and keeps
/// that transaction open, its locks held, until [`let_go`]: once this returns the
/// statement has run.
pub async fn hold_open(
    pg: &threadgate::store::testing::TestDb,
    sql: &'static str,
    param: String,
) -> (std::sync::mpsc::Sender<()>, tokio::task::JoinHandle<()>) {
    let holder = pg.open().expect("a second handle");
    let (ran_tx, ran) = std::sync::mpsc::channel::<()>();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let signals = std::sync::Arc::new(std::sync::Mutex::new((ran_tx, released)));
    let holding = tokio::spawn(async move {
        holder
            .write(move |c| {
                c.execute(sql, [&param])?;
                let signals = signals.lock().expect("signals");
                signals.0.send(()).expect("say it ran");
                signals.1.recv().expect("wait for the release");
                Ok(())
            })
            .await
            .expect("the holder's write")
    });
    tokio::task::spawn_blocking(move || ran.recv())
        .await
        .expect("join")
        .expect("the statement ran");
    (release, holding)
}

/// Ends what [`hold_open`] holds and waits for its transaction to end.
pub async fn let_go(release: std::sync::mpsc::Sender<()>, holding: tokio::task::JoinHandle<()>) {
    release.send(()).expect("release the gate");
    holding.await.expect("the holder ends");
}
