//! Uprobes on a file, attached all or nothing and detached together: what the Go-client
//! (`go_probes.rs`) and OpenSSL-client (`ssl_probes.rs`) programs share.
use std::{num::NonZeroU32, path::Path, time::Duration};

use aya::{
    programs::{
        uprobe::{UProbeAttachLocation, UProbeLink, UProbeLinkId, UProbeScope},
        UProbe,
    },
    Ebpf,
};

use super::{
    object::{program_of, Error, Result},
    removals::{self, UNDER_WAY},
};

/// How long an attach waits for the removal of its file's earlier probes (~1.5 s for a Go
/// binary's dozen, more on a loaded node) before it attaches anyway, said in the log.
pub const REMOVAL_WAIT_AT_MOST: Duration = Duration::from_secs(5);

/// The uprobes attached to one file; give them back to
/// [`Probes::detach_uprobes`](super::programs::Probes::detach_uprobes).
#[derive(Debug)]
pub struct Links {
    links: Vec<(&'static str, UProbeLinkId)>,
    /// The file they are on, if it could be known (then its removal is waited for).
    file: Option<removals::File>,
}

impl Links {
    pub fn len(&self) -> usize {
        self.links.len()
    }
}

/// Loads the uprobe programs `names` (not attached).
pub(super) fn load(ebpf: &mut Ebpf, names: &[&'static str]) -> Result<()> {
    for &name in names {
        let program: &mut UProbe = program_of(ebpf, name)?;
        program.load().map_err(|source| Error::Program { name, source })?;
    }
    Ok(())
}

/// Which processes a file's probes fire for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Every process that runs or maps the file (a Go client's binary: its processes are its
    /// clients).
    File,
    /// Process `pid` only: the kernel puts the breakpoints in that process's memory alone, so
    /// every other process that maps the file (a shared libssl) runs it untouched.
    Process(NonZeroU32),
}

/// Attaches each (program, place) in `file`, for the processes of `scope`: all or nothing.
/// For a whole file, waits first for the removal of the file's earlier probes (see
/// `removals.rs`); a process's own probes never fire twice for another's.
pub(super) fn attach<'a>(
    ebpf: &mut Ebpf,
    file: &Path,
    scope: Scope,
    sites: impl IntoIterator<Item = (&'static str, UProbeAttachLocation<'a>)>,
) -> Result<Links> {
    let (known, scope) = match scope {
        // A file that cannot be looked at is not attached to either: the attach says why.
        Scope::File => (removals::File::of(file).ok(), UProbeScope::AllProcesses),
        Scope::Process(pid) => (None, UProbeScope::OneProcess(pid)),
    };
    if let Some(known) = known {
        match UNDER_WAY.wait(known, REMOVAL_WAIT_AT_MOST) {
            Ok(waited) if waited >= Duration::from_millis(1) => tracing::info!(
                file = %file.display(),
                waited_ms = waited.as_secs_f64() * 1e3,
                "waited for this file's earlier probes to be removed"
            ),
            Ok(_) => {}
            Err(bound) => tracing::warn!(
                file = %file.display(),
                "this file's earlier probes are still being removed after {bound:?}: attached anyway, each probe may fire twice until they are gone"
            ),
        }
    }
    let mut links = Links {
        links: Vec::new(),
        file: known,
    };
    for (name, place) in sites {
        let attached = program_of::<UProbe>(ebpf, name).and_then(|p| {
            p.attach(place, file, scope)
                .map_err(|source| Error::Program { name, source })
        });
        match attached {
            Ok(link) => links.links.push((name, link)),
            Err(err) => {
                detach(ebpf, links);
                return Err(err);
            }
        }
    }
    Ok(links)
}

/// Detaches what [`attach`] attached, last attached first: the probes that start evidence
/// go before the ones that complete it (see `go_probes::Sites::each`). The kernel takes
/// 60–85 ms to remove each uprobe (1.5 s for a Go binary's dozen, measured), so the links are
/// only taken here and closed on a thread of their own: the caller (the event pump probing a
/// process that has just started, the judgement) does not wait for them, but a uprobe
/// registered meanwhile does, and an attach to the same file waits until they are all gone
/// (`removals.rs`; they are not put off: until they are gone, a file probed again would have
/// each probe twice).
pub(super) fn detach(ebpf: &mut Ebpf, links: Links) {
    let mut taken: Vec<UProbeLink> = Vec::with_capacity(links.len());
    // Under way until every link is closed, on the thread or, without one, here.
    let removal = links.file.map(|file| UNDER_WAY.begin(file));
    for (name, link) in links.links.into_iter().rev() {
        match program_of::<UProbe>(ebpf, name).and_then(|p| {
            p.take_link(link)
                .map_err(|source| Error::Program { name, source })
        }) {
            Ok(link) => taken.push(link),
            Err(err) => tracing::warn!("detaching {name}: {err}"),
        }
    }
    let closing = std::thread::Builder::new()
        .name("uprobe-detach".into())
        .spawn(move || {
            taken.into_iter().for_each(drop);
            drop(removal);
        });
    if let Err(err) = closing {
        tracing::warn!("no thread to detach uprobes on ({err}): they were detached in place");
    }
}
