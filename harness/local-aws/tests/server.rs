//! The one way to start the local server, as the scripts use it: the `local-aws` binary prints
//! an endpoint that answers, and the server ends with the process it was told to outlive no
//! longer (the scripts' shell), not with the binary.
//!
//! Needs the repository's `.venv` (`bash tests/run.sh` makes it).

use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn the_binary_prints_an_endpoint_that_answers_until_its_parent_is_gone() {
    let mut parent = Command::new("sleep")
        .arg("600")
        .spawn()
        .expect("start a stand-in parent");
    let out = Command::new(env!("CARGO_BIN_EXE_local-aws"))
        .args(["--parent-pid", &parent.id().to_string()])
        .output()
        .expect("run local-aws");
    assert!(
        out.status.success(),
        "local-aws failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let endpoint = String::from_utf8(out.stdout).expect("UTF-8");
    let address = endpoint
        .trim()
        .strip_prefix("http://127.0.0.1:")
        .map(|port| format!("127.0.0.1:{port}"))
        .unwrap_or_else(|| panic!("not a local endpoint: {endpoint:?}"));
    TcpStream::connect(&address).expect("the server listens after the binary exited");
    parent.kill().expect("end the parent");
    parent.wait().expect("reap the parent");
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(&address).is_ok() {
        assert!(
            Instant::now() < deadline,
            "{address} still listens 10 s after the server's parent ended"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
