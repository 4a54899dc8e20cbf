//! Every process the local run starts, and their end.
//!
//! Each child runs in its own process group (so a child's own children go with it) and, on
//! Linux, gets SIGTERM if this process dies, even by SIGKILL (`PR_SET_PDEATHSIG`). `stop_all`
//! sends SIGTERM to every group, waits a little, then SIGKILL; it runs at the end of a run, on
//! Ctrl-C / SIGTERM, on error, and from `Drop` (panics).
//!
//! Spawn only from the main thread: the parent-death signal follows the thread that spawned.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::server::{LocalAws, Options};
use crate::Error;

struct Managed {
    name: String,
    child: Child,
    log: PathBuf,
}

#[derive(Default)]
pub struct Supervisor {
    children: Mutex<Vec<Managed>>,
}

impl Supervisor {
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts `command` with stdout and stderr going to `log`.
    pub fn spawn(&self, name: &str, mut command: Command, log: &Path) -> Result<u32, Error> {
        let out = File::create(log).map_err(Error::io(format!("create {}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(Error::io(format!("open {}", log.display())))?;
        command.stdin(Stdio::null()).stdout(out).stderr(err);
        {
            use std::os::unix::process::CommandExt;
            command.process_group(0);
            #[cfg(target_os = "linux")]
            // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
            unsafe {
                command.pre_exec(|| {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = command.spawn().map_err(Error::io(format!(
            "start {name} ({:?})",
            command.get_program()
        )))?;
        let pid = child.id();
        self.adopt(name, child, log);
        Ok(pid)
    }

    /// Stops `child`, which leads a process group of its own, with the others.
    fn adopt(&self, name: &str, child: Child, log: &Path) {
        self.children
            .lock()
            .expect("supervisor lock")
            .push(Managed {
                name: name.to_owned(),
                child,
                log: log.to_owned(),
            });
    }

    /// Starts the local server (the kit's one way, `python` with the pinned moto; with
    /// `lambda_endpoint`, its Lambda bridge forwards invokes there) and answers its endpoint.
    pub fn start_server(
        &self,
        python: &Path,
        run_dir: &Path,
        lambda_endpoint: Option<&str>,
    ) -> Result<String, Error> {
        let options = Options {
            python: python.to_owned(),
            dir: run_dir.to_owned(),
            parent_pid: std::process::id(),
            lambda_endpoint: lambda_endpoint.map(str::to_owned),
        };
        let server = LocalAws::start(&options)?;
        let (endpoint, log) = (server.endpoint().to_owned(), server.log().to_owned());
        self.adopt("moto server", server.into_process(), &log);
        Ok(endpoint)
    }

    /// The first child that has exited, with its status and log: a run cannot go on without
    /// any of them.
    pub fn exited(&self) -> Option<(String, String, PathBuf)> {
        let mut children = self.children.lock().expect("supervisor lock");
        for m in children.iter_mut() {
            if let Ok(Some(status)) = m.child.try_wait() {
                return Some((m.name.clone(), status.to_string(), m.log.clone()));
            }
        }
        None
    }

    /// Stops every child (its whole process group): SIGTERM, up to 3 s, then SIGKILL.
    pub fn stop_all(&self) {
        let mut children = self.children.lock().unwrap_or_else(|p| p.into_inner());
        if children.is_empty() {
            return;
        }
        for m in children.iter_mut() {
            if m.child.try_wait().ok().flatten().is_none() {
                signal_group(m.child.id(), libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline
            && children
                .iter_mut()
                .any(|m| m.child.try_wait().ok().flatten().is_none())
        {
            std::thread::sleep(Duration::from_millis(50));
        }
        for m in children.iter_mut() {
            // Also the group of a child that exited: its own children may remain.
            signal_group(m.child.id(), libc::SIGKILL);
            let _ = m.child.wait();
        }
        children.clear();
    }
}

fn signal_group(pid: u32, signal: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: kill(2) with a negative pid signals that process group; no memory involved.
        unsafe {
            libc::kill(-pid, signal);
        }
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.stop_all();
    }
}
