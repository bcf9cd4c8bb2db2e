//! What the fake apiserver's certificates ([`crate::apiserver`]) and the real cluster's
//! ([`crate::real_cluster::pki`]) have in common.
use std::net::IpAddr;

use rcgen::{BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, KeyUsagePurpose, SanType};

/// A CA's parameters, named `common_name`. Nothing in them is random, so the same parameters
/// with the same key make the same issuer.
pub(crate) fn ca_params(common_name: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

/// Adds each of `names` to the subject alternative names of `params`, once: an IP address
/// where it parses as one, a DNS name otherwise. The error starts with the name refused.
pub(crate) fn add_sans(params: &mut CertificateParams, names: &[String]) -> Result<(), String> {
    for name in names {
        let san = match name.parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(name.clone().try_into().map_err(|e| format!("{name}: {e}"))?),
        };
        if !params.subject_alt_names.contains(&san) {
            params.subject_alt_names.push(san);
        }
    }
    Ok(())
}
