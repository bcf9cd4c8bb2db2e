//! The uprobes a process holds, read from the kernel, whichever way it attached them: each BPF
//! link in its descriptors (`/proc/PID/fdinfo`, `link_id`; the agent's, by aya) asked for its
//! program and, for a uprobe, the file and the offset in it (`BPF_OBJ_GET_INFO_BY_FD` on the
//! link, Linux 6.6 and later: the `bpftool` here prints neither for a perf-event link, and
//! `bpftool perf` lists no link), and each perf event with a program set on it (bpftrace's),
//! from `bpftool perf`.
use std::{
    fs,
    os::fd::{FromRawFd, OwnedFd},
};

use crate::{Failed, Result};

const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_LINK_GET_FD_BY_ID: libc::c_long = 30;
const BPF_LINK_TYPE_PERF_EVENT: u32 = 7;
const BPF_PERF_EVENT_UPROBE: u32 = 1;

/// A uprobe: its program, and where it is (the file's path resolved).
pub(super) struct Site {
    pub prog_id: u32,
    pub file: String,
    pub offset: u64,
}

/// The uprobes process `pid` holds, through BPF links and as perf events.
pub(super) fn uprobes(pid: u32) -> Result<Vec<Site>> {
    let dir = format!("/proc/{pid}/fdinfo");
    let entries = fs::read_dir(&dir).map_err(|e| Failed(format!("{dir}: {e}")))?;
    let mut sites = Vec::new();
    for entry in entries.flatten() {
        let text = fs::read_to_string(entry.path()).unwrap_or_default();
        let Some(link) = text
            .lines()
            .find_map(|l| l.strip_prefix("link_id:")?.trim().parse::<u32>().ok())
        else {
            continue;
        };
        if let Some(site) = uprobe_of(link)? {
            sites.push(site);
        }
    }
    sites.extend(perf_uprobes(pid)?);
    Ok(sites)
}

/// The uprobes process `pid` holds as perf events with a program set (`bpftool perf show`).
fn perf_uprobes(pid: u32) -> Result<Vec<Site>> {
    let out = std::process::Command::new("bpftool")
        .args(["perf", "show", "-j"])
        .output()
        .map_err(|e| Failed(format!("bpftool perf show: {e}")))?;
    let all: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| Failed(format!("bpftool perf show: not JSON: {e}")))?;
    Ok(all
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .filter(|e| e["pid"].as_u64() == Some(u64::from(pid)) && e["fd_type"] == "uprobe")
        .filter_map(|e| {
            Some(Site {
                prog_id: e["prog_id"].as_u64()? as u32,
                file: resolved(e["filename"].as_str()?.to_owned()),
                offset: e["offset"].as_u64()?,
            })
        })
        .collect())
}

/// Link `id`'s uprobe, if it is one (a link gone meanwhile: none).
fn uprobe_of(id: u32) -> Result<Option<Site>> {
    // `bpf_attr` for BPF_LINK_GET_FD_BY_ID: link_id at 0.
    let mut attr = [0u64; 16];
    attr[0] = u64::from(id);
    // SAFETY: bpf(2) with an attribute block of the size given, which it only reads.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, BPF_LINK_GET_FD_BY_ID, attr.as_mut_ptr(), 128) };
    if fd < 0 {
        return Ok(None);
    }
    // SAFETY: a descriptor the call just opened, owned here.
    let link = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // `struct bpf_link_info`: type, id, prog_id, then (8-aligned, at 16) the perf event's
    // type, and at 24 its uprobe's file_name pointer, name_len (32) and offset (36). Asked
    // first for the leading words only: the union's fields are another kind's for another
    // link (a raw tracepoint's name pointer and length), which the kernel would check.
    let mut info = [0u64; 32];
    link_info(&link, &mut info, 24)
        .map_err(|e| Failed(format!("bpf(BPF_OBJ_GET_INFO_BY_FD) on link {id}: {e}")))?;
    let (kind, prog_id) = (info[0] as u32, info[1] as u32);
    if kind != BPF_LINK_TYPE_PERF_EVENT || info[2] as u32 != BPF_PERF_EVENT_UPROBE {
        return Ok(None);
    }
    let mut name = [0u8; 4096];
    info[3] = name.as_mut_ptr() as u64;
    info[4] = name.len() as u64;
    link_info(&link, &mut info, 8 * 32).map_err(|e| {
        Failed(format!(
            "bpf(BPF_OBJ_GET_INFO_BY_FD) on link {id}, its uprobe: {e}"
        ))
    })?;
    let file = String::from_utf8_lossy(name.split(|&b| b == 0).next().unwrap_or_default()).into_owned();
    Ok(Some(Site {
        prog_id,
        file: resolved(file),
        offset: info[4] >> 32,
    }))
}

/// `BPF_OBJ_GET_INFO_BY_FD` on `link` into the first `len` bytes of `info` (whose pointers it
/// may write through).
fn link_info(link: &OwnedFd, info: &mut [u64; 32], len: usize) -> std::io::Result<()> {
    let mut attr = [0u64; 16];
    attr[0] = std::os::fd::AsRawFd::as_raw_fd(link) as u64 | (len as u64) << 32;
    attr[1] = info.as_mut_ptr() as u64;
    // SAFETY: bpf(2) writes at most `len` bytes to `info`, and through the name pointer in it
    // at most the length beside it.
    let done = unsafe { libc::syscall(libc::SYS_bpf, BPF_OBJ_GET_INFO_BY_FD, attr.as_mut_ptr(), 128) };
    if done < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The path a probe was attached by (the agent's: `/proc/PID/exe`), resolved while the process
/// lives; unchanged where it cannot be resolved.
fn resolved(file: String) -> String {
    fs::canonicalize(&file).map_or(file, |real| real.display().to_string())
}
