//! Several hosts on one machine, joined by links that misbehave on command (issue 52, item 1).
//!
//! Each host is a network namespace of its own, joined to this process's namespace by a veth pair:
//! a harness takes a free /24 of 198.18.0.0/15 (the range set aside for benchmarking networks), a
//! /30 of it a host (the host's end `.4i+2`, its peer here `.4i+1`).
//! Hosts talk to each other only through [`Link`]s: TCP proxies in this process (this kernel has
//! no `netem` qdisc, so the faults are injected in user space), each listening where it is told (a
//! host's peer address here, for that host to reach). A link delays every chunk it
//! forwards by a latency ± jitter (in order, pipelined as a wire is), drops a share of its
//! connections, and is cut and healed on command (a partition). Made and removed by the test, as
//! root; where namespaces cannot be made, [`Net::new`] says why and the caller skips.

use std::io::{BufRead, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::Rng;

/// Harnesses made by this process so far (each starts its search for a block elsewhere).
static MADE: AtomicU32 = AtomicU32::new(0);

/// The /24 blocks of 198.18.0.0/15.
const BLOCKS: usize = 512;

/// The namespaces of one harness; removed when dropped.
pub struct Net {
    hosts: Vec<Host>,
}

/// One host: its namespace, its address there and its peer's here.
pub struct Host {
    pub ns: String,
    pub ip: Ipv4Addr,
    pub here: Ipv4Addr,
    veth: String,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    match out.status.success() {
        true => Ok(()),
        false => Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
}

impl Net {
    /// `hosts` namespaces joined to this one (at most 64), or why they cannot be made here.
    pub fn new(hosts: usize) -> Result<Self, String> {
        assert!(hosts <= 64, "a harness has a /24, a /30 a host");
        let start =
            std::process::id() as usize * 31 + MADE.fetch_add(1, Ordering::Relaxed) as usize;
        // A block of 198.18.0.0/15 (the range set aside for benchmarking networks) no interface
        // here uses; its first namespace's name claims it against harnesses running at once.
        let mut last = String::new();
        for block in (0..BLOCKS).map(|k| (start + k) % BLOCKS) {
            let prefix = format!("198.{}.{}", 18 + block / 256, block % 256);
            let used = Command::new("ip")
                .args(["-o", "addr", "show", "to", &format!("{prefix}.0/24")])
                .output()
                .map_err(|e| format!("ip: {e}"))?;
            if !used.stdout.is_empty() {
                continue;
            }
            match ip(&["netns", "add", &format!("isc{block}h0")]) {
                Ok(()) => return Net::claimed(block, &prefix, hosts),
                Err(e) => last = e,
            }
        }
        Err(format!("no free block of 198.18.0.0/15 ({last})"))
    }

    /// The harness of `block`, whose first namespace is made already.
    fn claimed(block: usize, prefix: &str, hosts: usize) -> Result<Self, String> {
        let mut net = Net { hosts: Vec::new() };
        for i in 0..hosts {
            let host = Host {
                ns: format!("isc{block}h{i}"),
                ip: format!("{prefix}.{}", 4 * i + 2).parse().unwrap(),
                here: format!("{prefix}.{}", 4 * i + 1).parse().unwrap(),
                veth: format!("isc{block}v{i}"),
            };
            let peer = format!("{}p", host.veth);
            if i > 0 {
                ip(&["netns", "add", &host.ns])?;
            }
            // Pushed before the rest can fail, so that dropping the harness removes it.
            net.hosts.push(host);
            let host = &net.hosts[i];
            ip(&[
                "link", "add", &host.veth, "type", "veth", "peer", "name", &peer,
            ])?;
            ip(&["link", "set", &peer, "netns", &host.ns])?;
            ip(&[
                "addr",
                "add",
                &format!("{}/30", host.here),
                "dev",
                &host.veth,
            ])?;
            ip(&["link", "set", &host.veth, "up"])?;
            let inside = |args: &[&str]| {
                let mut all = vec!["netns", "exec", &host.ns, "ip"];
                all.extend_from_slice(args);
                ip(&all)
            };
            inside(&["addr", "add", &format!("{}/30", host.ip), "dev", &peer])?;
            inside(&["link", "set", &peer, "up"])?;
            inside(&["link", "set", "lo", "up"])?;
        }
        Ok(net)
    }

    pub fn host(&self, i: usize) -> &Host {
        &self.hosts[i]
    }
}

impl Host {
    /// `program` run inside the host's namespace.
    pub fn command(&self, program: &str) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.ns, program]);
        command
    }

    /// An address on the host (`port` there).
    pub fn at(&self, port: u16) -> SocketAddr {
        SocketAddr::new(IpAddr::V4(self.ip), port)
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for host in &self.hosts {
            // Deleting our end deletes the pair.
            let _ = ip(&["link", "del", &host.veth]);
            let _ = ip(&["netns", "del", &host.ns]);
        }
    }
}

/// What a link does to what it forwards.
/// The default is a link without faults.
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    pub latency: Duration,
    /// The delay of a chunk is `latency` ± up to this, uniformly (order kept).
    pub jitter: Duration,
    /// Share of forwarded chunks that end their connection instead (both ways, at once).
    pub drop_share: f64,
}

struct LinkState {
    target: SocketAddr,
    /// Read for every chunk, so a change reaches the connections open.
    faults: Arc<Mutex<Faults>>,
    cut: bool,
    /// The link is gone: its accepting thread ends.
    closed: bool,
    /// Both sockets of every connection open, to end them on a cut, with a token its two threads
    /// hold (a connection whose threads have ended is forgotten).
    open: Vec<([TcpStream; 2], Arc<()>)>,
}

/// A faulty link to `target`: connections to [`Link::addr`] reach it through the faults. Each
/// direction of a connection is a thread that sleeps until each chunk is due (the system's timer,
/// tens of microseconds; an async runtime's would round every delay up to its millisecond tick).
pub struct Link {
    pub addr: SocketAddr,
    state: Arc<Mutex<LinkState>>,
}

impl Link {
    /// A link listening on `listen` (port chosen), forwarding to `target`.
    pub fn start(listen: IpAddr, target: SocketAddr, faults: Faults) -> Link {
        let listener = TcpListener::bind(SocketAddr::new(listen, 0)).unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(LinkState {
            target,
            faults: Arc::new(Mutex::new(faults)),
            cut: false,
            closed: false,
            open: Vec::new(),
        }));
        let shared = Arc::clone(&state);
        std::thread::spawn(move || {
            for inbound in listener.incoming() {
                if shared.lock().unwrap().closed {
                    return;
                }
                let Ok(inbound) = inbound else {
                    // Out of descriptors, say: not a reason to spin.
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                let target = shared.lock().unwrap().target;
                let Ok(outbound) = TcpStream::connect(target) else {
                    continue;
                };
                // Checked and recorded under one lock, so a cut cannot miss it.
                let mut state = shared.lock().unwrap();
                if state.cut {
                    continue; // dropped: the caller sees its connection closed
                }
                state.open.retain(|(_, alive)| Arc::strong_count(alive) > 1);
                let alive = Arc::new(());
                if let Ok(ends) = forward(inbound, outbound, &state.faults, &alive) {
                    state.open.push((ends, alive));
                }
            }
        });
        Link { addr, state }
    }

    /// Cuts the link: every connection ends, new ones are closed as they come.
    pub fn cut(&self) {
        let mut state = self.state.lock().unwrap();
        state.cut = true;
        end_all(&mut state);
    }

    /// Points the link at `target` (an address changing hands): every connection ends, and new
    /// ones reach `target`.
    pub fn retarget(&self, target: SocketAddr) {
        let mut state = self.state.lock().unwrap();
        state.target = target;
        end_all(&mut state);
    }

    pub fn heal(&self) {
        self.state.lock().unwrap().cut = false;
    }

    /// What the link does from now on, to the connections open too (a link that slows down).
    pub fn set_faults(&self, faults: Faults) {
        *self.state.lock().unwrap().faults.lock().unwrap() = faults;
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.cut();
        self.state.lock().unwrap().closed = true;
        // Wakes the accepting thread, which finds the link closed.
        let _ = TcpStream::connect(self.addr);
    }
}

/// Ends every connection open through a link.
fn end_all(state: &mut LinkState) {
    for (ends, _) in state.open.drain(..) {
        for end in ends {
            let _ = end.shutdown(Shutdown::Both);
        }
    }
}

/// Starts one connection through the faults (a thread each way, each holding `alive`); returns
/// its two sockets.
fn forward(
    inbound: TcpStream,
    outbound: TcpStream,
    faults: &Arc<Mutex<Faults>>,
    alive: &Arc<()>,
) -> std::io::Result<[TcpStream; 2]> {
    inbound.set_nodelay(true)?;
    outbound.set_nodelay(true)?;
    let pair =
        || -> std::io::Result<[TcpStream; 2]> { Ok([inbound.try_clone()?, outbound.try_clone()?]) };
    let [i, o] = pair()?;
    one_way(i, o, Arc::clone(faults), pair()?, Arc::clone(alive));
    let [i, o] = pair()?;
    one_way(o, i, Arc::clone(faults), pair()?, Arc::clone(alive));
    pair()
}

/// Bytes from `from` to `to`, each chunk held until its time (a reading thread, a writing one);
/// at the end of `from`, what is held is written and `to` shut down for writing. A dropped chunk
/// ends the connection (`both`) at once.
fn one_way(
    mut from: TcpStream,
    mut to: TcpStream,
    faults: Arc<Mutex<Faults>>,
    both: [TcpStream; 2],
    alive: Arc<()>,
) {
    let (tx, rx) = std::sync::mpsc::channel::<(Instant, Vec<u8>)>();
    std::thread::spawn(move || {
        let _alive = alive;
        for (due, chunk) in rx {
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            if to.write_all(&chunk).is_err() {
                return;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
    std::thread::spawn(move || {
        let mut rng = rand::rng();
        let mut last_due = Instant::now();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let faults = *faults.lock().unwrap();
            if rng.random_bool(faults.drop_share.clamp(0.0, 1.0)) {
                for end in &both {
                    let _ = end.shutdown(Shutdown::Both);
                }
                return;
            }
            let jitter = faults.jitter.as_secs_f64();
            let shift = match jitter > 0.0 {
                true => rng.random_range(-jitter..=jitter),
                false => 0.0,
            };
            let delay = Duration::from_secs_f64((faults.latency.as_secs_f64() + shift).max(0.0));
            // In order, as a wire keeps them.
            last_due = last_due.max(Instant::now() + delay);
            if tx.send((last_due, buf[..n].to_vec())).is_err() {
                return;
            }
        }
    });
}

/// `infini-sidecar serve` run by a command (the binary, or `ip netns exec` of it in a host), killed
/// when dropped.
pub struct Server {
    child: Child,
    /// Where it listens, as its log says.
    pub addr: SocketAddr,
}

impl Server {
    /// `command` serving `config`, once it listens; its log is drained in the background.
    pub fn start(mut command: Command, config: &Path) -> Server {
        let mut child = command
            .args(["serve", "--config"])
            .arg(config)
            .env("NO_COLOR", "1")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut log = std::io::BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        let addr = loop {
            line.clear();
            let read = log.read_line(&mut line).unwrap();
            assert!(read > 0, "{} exited", config.display());
            if let Some((_, at)) = line.split_once("serving on ") {
                break at.trim().parse().unwrap();
            }
        };
        // Kept where `SIDECAR_TEST_LOGS` says (a folder), one file per config (a restart appends);
        // else dropped.
        let kept = std::env::var_os("SIDECAR_TEST_LOGS").and_then(|dir| {
            let name = config.file_stem()?.to_os_string();
            let path = Path::new(&dir).join(name).with_extension("log");
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path);
            file.ok()
        });
        std::thread::spawn(move || {
            let mut kept = kept;
            for line in log.lines().map_while(Result::ok) {
                if let Some(file) = kept.as_mut() {
                    let _ = writeln!(file, "{line}");
                }
            }
        });
        Server { child, addr }
    }

    /// Stops it as Kubernetes does (SIGTERM: it drains) and waits for it to exit.
    pub fn terminate(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
