//! Apiserver endpoints: what the agent watches connections to.
//!
//! An endpoint is a destination port plus an address prefix: a single host
//! (`10.96.0.1:443`, `[fd00::1]:6443`), a CIDR (`192.168.0.0/24:6443`, `[fd00::/64]:6443`) or a
//! name resolved at parse time (`localhost:6443`). Each becomes one longest-prefix-match key in
//! the kernel's `ENDPOINTS` map (see `lifeline_common::EndpointKey`).
use std::{
    collections::BTreeMap,
    fmt,
    net::{IpAddr, Ipv6Addr, SocketAddr, ToSocketAddrs},
    str::FromStr,
};

use lifeline_common::{EndpointKey, ENDPOINT_PORT_BITS};
use serde::Serialize;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("endpoint {input:?}: expected HOST:PORT, CIDR:PORT, [IPv6]:PORT or [IPv6/PREFIX]:PORT")]
    Syntax { input: String },
    #[error("endpoint {input:?}: port {port:?} is not a number from 1 to 65535")]
    Port { input: String, port: String },
    #[error("endpoint {input:?}: prefix length {prefix:?} is not valid for this address family (0-32 for IPv4, 0-128 for IPv6)")]
    Prefix { input: String, prefix: String },
    #[error("endpoint {input:?}: host {host:?} did not resolve: {reason}")]
    Resolve {
        input: String,
        host: String,
        reason: String,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// One address prefix and port. IPv4 prefixes are kept as IPv4 (`prefix_len` 0-32).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Endpoint {
    pub addr: IpAddr,
    pub prefix_len: u8,
    pub port: u16,
}

impl Endpoint {
    /// Parses one endpoint; host names are resolved (every address they resolve to).
    pub fn parse_all(input: &str) -> Result<Vec<Endpoint>> {
        let syntax = || Error::Syntax {
            input: input.to_owned(),
        };
        let (host, port) = input.trim().rsplit_once(':').ok_or_else(syntax)?;
        let port = parse_port(input, port)?;
        let host = match host.strip_prefix('[') {
            Some(rest) => rest.strip_suffix(']').ok_or_else(syntax)?,
            None if host.contains(':') => return Err(syntax()),
            None => host,
        };
        if host.is_empty() {
            return Err(syntax());
        }
        if let Some((addr, prefix)) = host.split_once('/') {
            let addr = IpAddr::from_str(addr).map_err(|_| syntax())?;
            let max = if addr.is_ipv4() { 32 } else { 128 };
            let prefix_len =
                prefix
                    .parse::<u8>()
                    .ok()
                    .filter(|p| *p <= max)
                    .ok_or_else(|| Error::Prefix {
                        input: input.to_owned(),
                        prefix: prefix.to_owned(),
                    })?;
            return Ok(vec![Endpoint {
                addr: mask(addr, prefix_len),
                prefix_len,
                port,
            }]);
        }
        if let Ok(addr) = IpAddr::from_str(host) {
            return Ok(vec![Endpoint::exact(addr, port)]);
        }
        if !host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        {
            return Err(syntax());
        }
        let resolved = (host, port).to_socket_addrs().map_err(|err| Error::Resolve {
            input: input.to_owned(),
            host: host.to_owned(),
            reason: err.to_string(),
        })?;
        let mut out: Vec<Endpoint> = resolved.map(|a| Endpoint::exact(a.ip(), port)).collect();
        out.sort();
        out.dedup();
        if out.is_empty() {
            return Err(Error::Resolve {
                input: input.to_owned(),
                host: host.to_owned(),
                reason: "no addresses".into(),
            });
        }
        Ok(out)
    }

    pub fn exact(addr: IpAddr, port: u16) -> Self {
        let addr = canonical_ip(addr);
        let prefix_len = if addr.is_ipv4() { 32 } else { 128 };
        Self {
            addr,
            prefix_len,
            port,
        }
    }

    /// True when a connection to `dest` goes to this endpoint.
    pub fn matches(&self, dest: SocketAddr) -> bool {
        if dest.port() != self.port {
            return false;
        }
        let ip = canonical_ip(dest.ip());
        ip.is_ipv4() == self.addr.is_ipv4() && mask(ip, self.prefix_len) == self.addr
    }

    /// The kernel map key: prefix over port + IPv6 (IPv4 mapped) address.
    pub fn kernel_key(&self) -> (u32, EndpointKey) {
        let (addr, bits) = match self.addr {
            IpAddr::V4(v4) => (v4.to_ipv6_mapped(), 96 + u32::from(self.prefix_len)),
            IpAddr::V6(v6) => (v6, u32::from(self.prefix_len)),
        };
        (
            ENDPOINT_PORT_BITS + bits,
            EndpointKey {
                port_be: self.port.to_be_bytes(),
                addr: addr.octets(),
            },
        )
    }

    /// The one address of a host endpoint; `None` for a CIDR.
    pub fn host_addr(&self) -> Option<SocketAddr> {
        self.is_host().then_some(SocketAddr::new(self.addr, self.port))
    }

    fn is_host(&self) -> bool {
        self.prefix_len == if self.addr.is_ipv4() { 32 } else { 128 }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.addr, self.is_host()) {
            (IpAddr::V4(a), true) => write!(f, "{a}:{}", self.port),
            (IpAddr::V4(a), false) => write!(f, "{a}/{}:{}", self.prefix_len, self.port),
            (IpAddr::V6(a), true) => write!(f, "[{a}]:{}", self.port),
            (IpAddr::V6(a), false) => write!(f, "[{a}/{}]:{}", self.prefix_len, self.port),
        }
    }
}

impl Serialize for Endpoint {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

fn parse_port(input: &str, port: &str) -> Result<u16> {
    port.parse::<u16>()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| Error::Port {
            input: input.to_owned(),
            port: port.to_owned(),
        })
}

/// IPv4-mapped IPv6 addresses are IPv4 for matching purposes.
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

fn mask(ip: IpAddr, prefix_len: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let m = u32::MAX.checked_shl(32 - u32::from(prefix_len)).unwrap_or(0);
            IpAddr::V4((bits & m).into())
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let m = u128::MAX.checked_shl(128 - u32::from(prefix_len)).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(bits & m))
        }
    }
}

/// Where an endpoint in force came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// `--endpoint` on the command line.
    Flag,
    /// The config file's `endpoints`.
    Config,
    /// A server URL of the kubeconfig's current context.
    Kubeconfig,
    /// The in-cluster apiserver address (`KUBERNETES_SERVICE_HOST`/`_PORT`).
    InCluster,
    /// A ClusterIP and port of the `default/kubernetes` Service.
    Service,
    /// An address and port of an EndpointSlice of the `default/kubernetes` Service.
    EndpointSlice,
    /// An address and port of the core v1 Endpoints `default/kubernetes` (apiservers without
    /// `discovery.k8s.io/v1`).
    Endpoints,
    /// The server of the kubelet's kubeconfig on this node (`cluster/node_local.rs`).
    #[serde(rename = "kubelet-kubeconfig")]
    KubeletKubeconfig,
    /// A loopback address at which an apiserver, or the node-local proxy the kubelet uses,
    /// listens on this node (`cluster/node_local.rs`).
    #[serde(rename = "local-apiserver")]
    LocalApiserver,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Flag => "flag",
            Source::Config => "config",
            Source::Kubeconfig => "kubeconfig",
            Source::InCluster => "incluster",
            Source::Service => "service",
            Source::EndpointSlice => "endpointslice",
            Source::Endpoints => "endpoints",
            Source::KubeletKubeconfig => "kubelet-kubeconfig",
            Source::LocalApiserver => "local-apiserver",
        }
    }
}

/// The endpoints in force, each with the sources that asked for it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EndpointSet {
    entries: BTreeMap<Endpoint, Vec<Source>>,
}

impl EndpointSet {
    pub fn insert(&mut self, endpoint: Endpoint, source: Source) {
        let sources = self.entries.entry(endpoint).or_default();
        if !sources.contains(&source) {
            sources.push(source);
            sources.sort();
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Endpoint, &[Source])> {
        self.entries.iter().map(|(e, s)| (e, s.as_slice()))
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The most specific endpoint that `dest` goes to, as the kernel's longest-prefix match.
    pub fn matching(&self, dest: SocketAddr) -> Option<Endpoint> {
        self.entries
            .keys()
            .filter(|e| e.matches(dest))
            .max_by_key(|e| e.prefix_len)
            .copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(s: &str) -> Endpoint {
        let mut v = Endpoint::parse_all(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        assert_eq!(v.len(), 1, "{s}");
        v.remove(0)
    }

    #[test]
    fn parses_and_prints_every_form() {
        for (input, canonical) in [
            ("10.96.0.1:443", "10.96.0.1:443"),
            ("192.168.0.7/24:6443", "192.168.0.0/24:6443"),
            ("[fd00::1]:6443", "[fd00::1]:6443"),
            ("[fd00::1/64]:6443", "[fd00::/64]:6443"),
            ("[::ffff:127.0.0.1]:80", "127.0.0.1:80"),
            (" 127.0.0.1:1 ", "127.0.0.1:1"),
        ] {
            assert_eq!(one(input).to_string(), canonical, "{input}");
        }
    }

    #[test]
    fn resolves_names() {
        let v = Endpoint::parse_all("localhost:6443").expect("localhost resolves");
        assert!(v.iter().any(|e| e.to_string() == "127.0.0.1:6443"), "{v:?}");
    }

    #[test]
    fn rejects_bad_input_naming_it() {
        for (input, needle) in [
            ("nonsense", "nonsense"),
            ("1.2.3.4:0", "port \"0\""),
            ("1.2.3.4:http", "port \"http\""),
            ("1.2.3.4:70000", "port \"70000\""),
            ("1.2.3.4/33:80", "prefix length \"33\""),
            ("[::1/129]:80", "prefix length \"129\""),
            ("::1:80", "expected HOST:PORT"),
            ("[::1:80", "expected HOST:PORT"),
            (":80", "expected HOST:PORT"),
            ("bad host!:80", "expected HOST:PORT"),
            ("no-such-host.invalid:443", "did not resolve"),
        ] {
            let err = Endpoint::parse_all(input).expect_err(input).to_string();
            assert!(
                err.contains(needle) && err.contains(input.trim()),
                "{input}: {err}"
            );
        }
    }

    #[test]
    fn matches_hosts_cidrs_and_mapped_addresses() {
        let cidr = one("10.250.0.0/24:6443");
        assert!(cidr.matches("10.250.0.9:6443".parse().unwrap()));
        assert!(cidr.matches("[::ffff:10.250.0.9]:6443".parse().unwrap()));
        assert!(!cidr.matches("10.250.1.9:6443".parse().unwrap()));
        assert!(!cidr.matches("10.250.0.9:6444".parse().unwrap()));
        let v6 = one("[fd00::/64]:443");
        assert!(v6.matches("[fd00::5]:443".parse().unwrap()));
        assert!(!v6.matches("[fd01::5]:443".parse().unwrap()));
    }

    #[test]
    fn kernel_key_covers_port_and_prefix() {
        let (bits, key) = one("10.0.0.0/8:443").kernel_key();
        assert_eq!(bits, 16 + 96 + 8);
        assert_eq!(key.port_be, 443u16.to_be_bytes());
        assert_eq!(&key.addr[10..13], &[0xff, 0xff, 10]);
        let (bits, _) = one("[::1]:443").kernel_key();
        assert_eq!(bits, 16 + 128);
    }

    #[test]
    fn set_prefers_most_specific_match_and_tracks_sources() {
        let mut set = EndpointSet::default();
        set.insert(one("10.0.0.0/8:443"), Source::Config);
        set.insert(one("10.1.2.3:443"), Source::Flag);
        set.insert(one("10.1.2.3:443"), Source::Config);
        let dest = "10.1.2.3:443".parse().unwrap();
        assert_eq!(set.matching(dest), Some(one("10.1.2.3:443")));
        assert_eq!(
            set.matching("10.9.9.9:443".parse().unwrap()),
            Some(one("10.0.0.0/8:443"))
        );
        let sources: Vec<_> = set.iter().map(|(_, s)| s.to_vec()).collect();
        assert_eq!(
            sources,
            vec![vec![Source::Config], vec![Source::Flag, Source::Config]]
        );
    }
}
