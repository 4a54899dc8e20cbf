//! `semctl top` used as a person would, against the real local server: the live view runs in
//! tmux and is read off the screen with `capture-pane` (each lock, its used/limit, a holder, the
//! line's length and its oldest waiter's age, the start rate), follows a change of the table on
//! its next refreshes, redraws at a new size, keeps the last frame with the failure named when a
//! refresh fails, and leaves the terminal as it found it (normal screen, cooked mode) when q,
//! Esc, Ctrl-C or SIGTERM ends it. `--once` prints the same frame, in colour at the terminal's
//! width on a terminal, as plain text otherwise; bad input is a named error.
//!
//! The tmux tests skip, saying so, where tmux is not installed (CI installs it: `.ci/run`).

use semaphore_core::Claim;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use local_aws::names::{id, limit, lock};
use local_aws::{client_for, endpoint, fresh_table};
use semaphore_core::{
    AcquireOutcome, Attempt, Clock, DynamoStore, Rate, Run, Semaphore, SystemClock, TaskToken,
    Terms, Waiter, Weight,
};

const BUILDER: &str = "arn:aws:states:us-east-1:123456789012:execution:builds";

/// A table with three locks, as a person would find one in use:
/// - `builds`: limit 3, held by `build-1` (weight 1) and `build-2` (weight 2), two waiting in
///   line, the first for about 7 s;
/// - `deploys`: limit 1 at 0.5 starts a second, held by `alice`;
/// - `reports`: limit 10, held by `nightly` with weight 4.
async fn busy_table() -> (DynamoStore, Semaphore<DynamoStore>) {
    let store = fresh_table().await;
    let semaphore = Semaphore::new(store.clone());
    let take = |who: &str, lock_name: &str, terms: Terms| {
        let semaphore = semaphore.clone();
        let (who, lock_name) = (id(who, "default"), lock(lock_name));
        async move {
            let outcome = semaphore.acquire(&lock_name, &who, terms).await.unwrap();
            assert!(
                matches!(outcome, AcquireOutcome::Acquired { .. }),
                "{outcome:?}"
            );
        }
    };
    let terms = |n: i64, weight: i64, rate: Option<&str>| {
        Terms::new(
            limit(n),
            Weight::new(weight).unwrap(),
            rate.map(|r| Rate::parse(r).unwrap()),
        )
        .unwrap()
    };
    take(&format!("{BUILDER}:build-1"), "builds", terms(3, 1, None)).await;
    take(&format!("{BUILDER}:build-2"), "builds", terms(3, 2, None)).await;
    take("alice", "deploys", terms(1, 1, Some("0.5"))).await;
    take("nightly", "reports", terms(10, 4, None)).await;
    let now = SystemClock.now_ms();
    for (name, waited_ms) in [("build-3", 7_000), ("build-4", 2_000)] {
        let waiter = Waiter::new(
            lock("builds"),
            id(&format!("{BUILDER}:{name}"), "default"),
            Run::FIRST,
            limit(3),
            now - waited_ms,
            TaskToken::new(format!("{name}-task")).unwrap(),
            Attempt::new(now - waited_ms, 0),
            "{}".to_owned(),
        );
        assert_eq!(
            semaphore.enqueue(&waiter, now).await.unwrap(),
            semaphore_core::QueueOutcome::Queued
        );
    }
    (store, semaphore)
}

fn semctl(endpoint_url: &str, table: &str, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_semctl"));
    command
        .args(["--endpoint-url", endpoint_url, "--table", table])
        .args(args)
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_REGION", "us-east-1")
        .env_remove("AWS_PROFILE")
        .env_remove("QUEUE_TABLE_NAME");
    command
}

/// The words of the screen line that starts with `name` (a lock's row: name, used/limit, the
/// bar, holders, waiting, oldest wait, start rate), if it is on screen.
fn row<'a>(screen: &'a str, name: &str) -> Option<Vec<&'a str>> {
    screen
        .lines()
        .map(|line| line.split_whitespace().collect::<Vec<_>>())
        .find(|words| words.first() == Some(&name))
}

/// Whole seconds of an age as the view writes it ("7s", "1m02s").
fn seconds(age: &str) -> u64 {
    let (minutes, rest) = age.split_once('m').unwrap_or(("0", age));
    minutes.parse::<u64>().unwrap() * 60 + rest.trim_end_matches('s').parse::<u64>().unwrap()
}

/// A tmux server of this test's own (its own socket), killed when dropped.
struct Tmux {
    socket: std::path::PathBuf,
}

impl Tmux {
    /// Whether tmux is installed; if not, the test says on stderr that it skips.
    fn installed() -> bool {
        let found = Command::new("tmux")
            .arg("-V")
            .output()
            .is_ok_and(|out| out.status.success());
        if !found {
            eprintln!(
                "SKIPPED: tmux is not installed, so `semctl top` cannot be run on a terminal \
                 here (apt-get install tmux; CI installs it)"
            );
        }
        found
    }

    /// Runs `command` (its output shown in the pane; the pane stays after it exits) in a
    /// detached session of `width` x `height`.
    fn start(command: &Command, width: u16, height: u16) -> Self {
        let tmux = Self {
            socket: std::env::temp_dir().join(format!("semctl-top-{:016x}", fastrand::u64(..))),
        };
        let mut line = vec![command.get_program().to_string_lossy().into_owned()];
        line.extend(command.get_args().map(|a| a.to_string_lossy().into_owned()));
        let mut env = Vec::new();
        for (key, value) in command.get_envs() {
            if let Some(value) = value {
                env.push(quote(&format!(
                    "{}={}",
                    key.to_string_lossy(),
                    value.to_string_lossy()
                )));
            }
        }
        // After semctl: its exit status, then whether the terminal is back in cooked mode with
        // echo (`stty` says `icanon echo`; raw mode left on would say `-icanon -echo`).
        let script = format!(
            "env -u AWS_PROFILE {} {}; echo \"semctl exited $?\"; \
             echo \"tty: $(stty -a | tr ' ;' '\\n\\n' | grep -x -e icanon -e -icanon -e echo -e -echo | tr '\\n' ' ')\"; \
             sleep 600",
            env.join(" "),
            line.iter().map(|w| quote(w)).collect::<Vec<_>>().join(" ")
        );
        tmux.run(&[
            "new-session",
            "-d",
            "-x",
            &width.to_string(),
            "-y",
            &height.to_string(),
            "sh",
            "-c",
            &script,
        ]);
        tmux
    }

    fn run(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .args(["-f", "/dev/null"])
            .args(args)
            .env_remove("TMUX")
            .output()
            .expect("run tmux");
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The screen as a person sees it.
    fn screen(&self) -> String {
        self.run(&["capture-pane", "-p"])
    }

    /// The screen once `ready` holds for it; fails showing the last screen after 30 s.
    fn wait_for(&self, what: &str, ready: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let screen = self.screen();
            if ready(&screen) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "waited 30 s for {what}; the screen:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn keys(&self, keys: &str) {
        self.run(&["send-keys", keys]);
    }

    fn alternate_screen(&self) -> bool {
        self.run(&["display-message", "-p", "#{alternate_on}"])
            .trim()
            == "1"
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .arg("kill-server")
            .output();
        // tmux leaves its socket behind.
        let _ = std::fs::remove_file(&self.socket);
    }
}

fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', "'\\''"))
}

/// After semctl ended: it exited `code`, the pane left the alternate screen, the terminal is in
/// cooked mode with echo, and the frame is gone from the screen.
fn assert_restored(tmux: &Tmux, code: i32) {
    let exited = format!("semctl exited {code}");
    let screen = tmux.wait_for(&exited, |screen| screen.contains("tty: "));
    assert!(screen.contains(&exited), "{screen}");
    assert!(!tmux.alternate_screen(), "still on the alternate screen");
    let tty = screen
        .lines()
        .find_map(|line| line.strip_prefix("tty: "))
        .unwrap();
    assert_eq!(
        tty.trim(),
        "icanon echo",
        "the terminal's modes after semctl"
    );
    assert!(
        !screen.contains('█'),
        "the frame is still on screen:\n{screen}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn top_shows_every_lock_follows_a_release_redraws_on_resize_and_q_restores_the_terminal() {
    if !Tmux::installed() {
        return;
    }
    let (store, semaphore) = busy_table().await;
    let tmux = Tmux::start(&semctl(endpoint(), store.table(), &["top"]), 120, 30);

    let screen = tmux.wait_for("the first frame", |screen| {
        ["builds", "deploys", "reports"]
            .iter()
            .all(|name| row(screen, name).is_some())
    });
    println!("the first frame:\n{screen}");
    assert!(
        screen.contains(&format!("table {}", store.table())),
        "{screen}"
    );
    assert!(screen.contains("3 locks"), "{screen}");
    let builds = row(&screen, "builds").unwrap();
    // name, used/limit, bar, holders, waiting, oldest wait, start rate.
    assert_eq!(builds[1], "3/3", "{screen}");
    assert!(builds[2].chars().all(|c| c == '█'), "a full bar: {screen}");
    assert_eq!(
        (builds[3], builds[4]),
        ("2", "2"),
        "holders, waiting: {screen}"
    );
    let oldest = seconds(builds[5]);
    assert!(
        (7..40).contains(&oldest),
        "oldest wait {oldest} s: {screen}"
    );
    assert_eq!(builds[7], "seen", "{screen}");
    let deploys = row(&screen, "deploys").unwrap();
    assert_eq!(
        (deploys[1], deploys[3], deploys[4], deploys[5], deploys[6], deploys[7]),
        ("1/1", "1", "0", "-", "0.5/s", "set"),
        "{screen}"
    );
    let reports = row(&screen, "reports").unwrap();
    assert_eq!((reports[1], reports[3]), ("4/10", "1"), "{screen}");
    assert!(
        reports[2].starts_with('█') && reports[2].ends_with('░'),
        "a bar 4/10 full: {screen}"
    );
    for holder in [
        "execution:builds:build-1#default  weight 1",
        "execution:builds:build-2#default  weight 2",
        "alice#default  weight 1",
        "nightly#default  weight 4",
    ] {
        assert!(screen.contains(holder), "{holder:?} on screen:\n{screen}");
    }
    let wide_bar = builds[2].chars().count();

    // A slot freed: a refresh or two later, the view shows it (the line stays: nothing handed
    // the slot on).
    semaphore
        .release(
            &lock("builds"),
            &id(&format!("{BUILDER}:build-2"), "default"),
            Claim::Operator,
        )
        .await
        .unwrap();
    let screen = tmux.wait_for("the release on screen", |screen| {
        row(screen, "builds").is_some_and(|builds| builds[1] == "1/3")
    });
    let builds = row(&screen, "builds").unwrap();
    assert_eq!(
        (builds[3], builds[4]),
        ("1", "2"),
        "holders, waiting: {screen}"
    );
    assert!(!screen.contains("build-2"), "{screen}");
    assert!(screen.contains("build-1#default"), "{screen}");

    // A narrower window: the frame is drawn again to fit it, every lock still there.
    tmux.run(&["resize-window", "-x", "80", "-y", "30"]);
    let screen = tmux.wait_for("the frame at 80 columns", |screen| {
        row(screen, "builds").is_some_and(|builds| builds[2].chars().count() < wide_bar)
    });
    // Laid out anew, not cut: every row still ends with its start rate.
    for (name, which) in [("builds", "seen"), ("deploys", "set"), ("reports", "seen")] {
        let words = row(&screen, name).unwrap();
        assert_eq!(words.last(), Some(&which), "{name}: {screen}");
    }

    // The table gone: the last frame stays, with the failure named; the view goes on.
    store
        .client()
        .delete_table()
        .table_name(store.table())
        .send()
        .await
        .unwrap();
    let words = |screen: &str| screen.split_whitespace().collect::<Vec<_>>().join(" ");
    let screen = tmux.wait_for("the failed refresh named", |screen| {
        words(screen).contains("failed: table")
    });
    assert!(
        words(&screen).contains(&format!("table \"{}\" does not exist", store.table())),
        "{screen}"
    );
    assert!(row(&screen, "builds").is_some(), "{screen}");

    tmux.keys("q");
    assert_restored(&tmux, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn ctrl_c_esc_and_sigterm_end_top_and_restore_the_terminal() {
    if !Tmux::installed() {
        return;
    }
    let (store, _semaphore) = busy_table().await;
    for ending in ["C-c", "Escape", "SIGTERM"] {
        let tmux = Tmux::start(&semctl(endpoint(), store.table(), &["top"]), 100, 24);
        tmux.wait_for("the first frame", |screen| row(screen, "builds").is_some());
        assert!(tmux.alternate_screen());
        if ending == "SIGTERM" {
            // semctl is the only child of the pane's shell.
            let shell = tmux.run(&["display-message", "-p", "#{pane_pid}"]);
            let children = Command::new("ps")
                .args(["-o", "pid=", "--ppid", shell.trim()])
                .output()
                .unwrap();
            let semctl_pid = String::from_utf8_lossy(&children.stdout).trim().to_owned();
            assert!(semctl_pid.parse::<u32>().is_ok(), "{semctl_pid:?}");
            let killed = Command::new("kill")
                .args(["-TERM", &semctl_pid])
                .status()
                .unwrap();
            assert!(killed.success());
        } else {
            tmux.keys(ending);
        }
        assert_restored(&tmux, 0);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn top_on_a_table_that_does_not_exist_says_so_and_leaves_the_terminal_alone() {
    if !Tmux::installed() {
        return;
    }
    let table = format!("no-such-table-{:08x}", fastrand::u32(..));
    let tmux = Tmux::start(&semctl(endpoint(), &table, &["top"]), 100, 24);
    let screen = tmux.wait_for("the error", |screen| screen.contains("tty: "));
    assert!(
        screen.contains(&format!(
            "semctl: error: table \"{table}\" does not exist: create it with `semctl init`"
        )),
        "{screen}"
    );
    assert!(!screen.contains("panicked"), "{screen}");
    assert_restored(&tmux, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn once_on_a_terminal_prints_the_frame_in_colour_into_the_scrollback() {
    if !Tmux::installed() {
        return;
    }
    let (store, _semaphore) = busy_table().await;
    let tmux = Tmux::start(
        &semctl(endpoint(), store.table(), &["top", "--once"]),
        90,
        24,
    );
    let screen = tmux.wait_for("semctl to end", |screen| screen.contains("tty: "));
    assert!(screen.contains("semctl exited 0"), "{screen}");
    let builds = row(&screen, "builds").expect("the frame stays on screen");
    assert_eq!((builds[1], builds[4]), ("3/3", "2"), "{screen}");
    // The frame was sized to the terminal: the bar fills what the other columns leave of 90.
    let longest = screen.lines().map(|l| l.chars().count()).max().unwrap();
    assert_eq!(longest, 90, "{screen}");
    // With its colours: the full bar red, as the escape codes tmux keeps for the pane say.
    let coloured = tmux.run(&["capture-pane", "-p", "-e"]);
    let bar_line = coloured
        .lines()
        .find(|line| line.contains("builds"))
        .unwrap();
    assert!(
        bar_line.contains("\x1b[31m█") || bar_line.contains("\x1b[38;5;1m█"),
        "a red bar: {bar_line:?}"
    );
    // Printed like any command's output: no alternate screen, the terminal in cooked mode.
    assert!(!tmux.alternate_screen());
    assert!(screen.contains("tty: icanon echo"), "{screen}");
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn once_prints_one_frame_as_plain_text() {
    let (store, _semaphore) = busy_table().await;
    let out = semctl(endpoint(), store.table(), &["top", "--once"])
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
    assert!(
        !stdout.contains('\x1b'),
        "an escape code in the text: {stdout:?}"
    );
    assert!(
        stdout.lines().all(|line| line.chars().count() <= 100),
        "{stdout}"
    );
    assert!(stdout.starts_with("semctl top  table "), "{stdout}");
    let builds = row(&stdout, "builds").unwrap();
    assert_eq!(
        (builds[1], builds[3], builds[4], builds[7]),
        ("3/3", "2", "2", "seen"),
        "{stdout}"
    );
    assert!(seconds(builds[5]) >= 7, "{stdout}");
    assert_eq!(row(&stdout, "deploys").unwrap()[6], "0.5/s", "{stdout}");
    assert_eq!(row(&stdout, "reports").unwrap()[1], "4/10", "{stdout}");
    assert!(
        stdout.contains("build-2#default  weight 2  held "),
        "{stdout}"
    );
    assert!(stdout.contains("nightly#default  weight 4"), "{stdout}");
    // No key help on a frame that takes no keys.
    assert!(!stdout.contains("q quit"), "{stdout}");

    // --holders: the longest held are listed, the others counted.
    let out = semctl(
        endpoint(),
        store.table(),
        &["top", "--once", "--holders", "1"],
    )
    .output()
    .unwrap();
    let (stdout, _) = text(&out);
    assert!(stdout.contains("build-1#default"), "{stdout}");
    assert!(!stdout.contains("build-2#default"), "{stdout}");
    assert!(stdout.contains("… and 1 more holder(s)"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread")]
async fn once_shows_an_unreadable_item_by_name_with_the_others_and_exits_1() {
    let (store, _semaphore) = busy_table().await;
    local_aws::foreign::put_foreign_item(
        &client_for(endpoint()),
        store.table(),
        "foreign",
        "other-holder",
        "default",
        Some(local_aws::foreign::FOREIGN_FORMAT),
    )
    .await;
    let out = semctl(endpoint(), store.table(), &["top", "--once"])
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(
        stderr.contains("semctl: error: some items could not be read (1, shown in the frame)")
            && stderr.contains("\"foreign\" is in format 99"),
        "{stderr}"
    );
    let foreign = row(&stdout, "foreign").unwrap();
    assert_eq!(&foreign[1..4], ["cannot", "be", "read:"], "{stdout}");
    assert_eq!(row(&stdout, "builds").unwrap()[1], "3/3", "{stdout}");
    assert!(stdout.contains("4 locks"), "{stdout}");
}

#[test]
fn bad_input_to_top_is_a_named_error() {
    let table = format!("no-such-table-{:08x}", fastrand::u32(..));
    let cases: [(Vec<&str>, &str, String); 5] = [
        (
            vec!["top", "--once"],
            endpoint(),
            format!("table \"{table}\" does not exist"),
        ),
        (
            // Nothing listens on the discard port.
            vec!["top", "--once"],
            "http://127.0.0.1:9",
            format!("DynamoDB Scan on table \"{table}\" failed: dispatch failure"),
        ),
        (
            // stdout is a pipe here.
            vec!["top"],
            endpoint(),
            "stdout is not one: pass --once".to_owned(),
        ),
        (
            vec!["top", "--once", "--interval", "0.1"],
            endpoint(),
            "expected seconds from 0.5 to 10".to_owned(),
        ),
        (
            vec!["top", "--once", "--interval", "fast"],
            endpoint(),
            "expected seconds from 0.5 to 10".to_owned(),
        ),
    ];
    for (args, endpoint_url, expected) in cases {
        let out = semctl(endpoint_url, &table, &args).output().unwrap();
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains(&expected),
            "{args:?}: {expected:?} in {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        assert!(stdout.is_empty(), "{args:?}: {stdout}");
    }
}
