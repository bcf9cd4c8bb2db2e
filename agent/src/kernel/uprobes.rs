//! Uprobes on a file, attached all or nothing and detached together: what the Go-client
//! (`go_probes.rs`) and OpenSSL-client (`ssl_probes.rs`) programs share.
use std::path::Path;

use aya::{
    programs::{
        uprobe::{UProbeAttachLocation, UProbeLink, UProbeLinkId, UProbeScope},
        UProbe,
    },
    Ebpf,
};

use super::object::{program_of, Error, Result};

/// The uprobes attached to one file; give them back to
/// [`Probes::detach_uprobes`](super::programs::Probes::detach_uprobes).
#[derive(Debug)]
pub struct Links(Vec<(&'static str, UProbeLinkId)>);

impl Links {
    pub fn len(&self) -> usize {
        self.0.len()
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

/// Attaches each (program, place) in `file`, for every process that runs or maps it: all or
/// nothing.
pub(super) fn attach<'a>(
    ebpf: &mut Ebpf,
    file: &Path,
    sites: impl IntoIterator<Item = (&'static str, UProbeAttachLocation<'a>)>,
) -> Result<Links> {
    let mut links = Links(Vec::new());
    for (name, place) in sites {
        let attached = program_of::<UProbe>(ebpf, name).and_then(|p| {
            p.attach(place, file, UProbeScope::AllProcesses)
                .map_err(|source| Error::Program { name, source })
        });
        match attached {
            Ok(link) => links.0.push((name, link)),
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
/// registered meanwhile does (they are not put off: until they are gone, a file probed again
/// would have each probe twice).
pub(super) fn detach(ebpf: &mut Ebpf, links: Links) {
    let mut taken: Vec<UProbeLink> = Vec::with_capacity(links.len());
    for (name, link) in links.0.into_iter().rev() {
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
        .spawn(move || taken.into_iter().for_each(drop));
    if let Err(err) = closing {
        tracing::warn!("no thread to detach uprobes on ({err}): they were detached in place");
    }
}
