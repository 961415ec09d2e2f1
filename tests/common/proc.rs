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
