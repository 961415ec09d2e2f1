//! Figures of a process read from `/proc` (the benchmarks' and the node tests' instruments),
//! and the file limit a thousand sockets need.

#![allow(dead_code)]

/// The resident memory of `pid` (VmRSS), in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:")
}

/// A figure of `/proc/PID/status` given in kB.
fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix(field)?
                    .trim()
                    .split(' ')
                    .next()?
                    .parse()
                    .ok()
            })
        })
        .unwrap_or(0)
}

/// 1,000 followers need 1,000 sockets here and in the server (which inherits this limit).
pub fn raise_fd_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write one plain struct we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// The peak resident memory of `pid` (VmHWM), in KiB.
pub fn peak_rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmHWM:")
}

/// The machine's TCP memory in use, in KiB: every socket's buffers, of every network namespace
/// (the kernel keeps one count: the `mem` pages of `/proc/net/sockstat`'s TCP line).
pub fn tcp_memory_kib() -> u64 {
    let sockstat = std::fs::read_to_string("/proc/net/sockstat").unwrap_or_default();
    let pages = sockstat
        .lines()
        .find(|l| l.starts_with("TCP:"))
        .and_then(|l| l.split_whitespace().skip_while(|w| *w != "mem").nth(1))
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0);
    pages * page_kib()
}

/// Where the kernel starts to squeeze TCP memory (`net.ipv4.tcp_mem`'s second figure), in KiB;
/// past its third it drops packets on every connection.
pub fn tcp_memory_pressure_kib() -> u64 {
    let limits = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_mem").unwrap_or_default();
    let pressure: u64 = limits
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    pressure * page_kib()
}

fn page_kib() -> u64 {
    // SAFETY: sysconf reads a constant of the system.
    let bytes = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(bytes).unwrap_or(4096) / 1024
}
