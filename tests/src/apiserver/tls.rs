//! The CA and the server certificate of `ll-apiserver`.
use std::path::Path;
use std::sync::Arc;

use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::TlsAcceptor;

use crate::certs;

/// The CA's parameters. They are the same on every run, so a CA key loaded from `ca-key.pem`
/// signs certificates whose issuer matches the `ca.pem` written on the first run.
fn ca_params() -> CertificateParams {
    certs::ca_params("ll-apiserver-ca")
}

fn write_file(path: &Path, contents: &str) -> Result<(), String> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).map_err(|e| format!("write {}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("rename to {}: {e}", path.display()))
}

/// Loads or creates the CA, issues the server certificate, and returns its chain and key.
fn certificates(
    dir: &Path,
    sans: &[String],
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let ca_pem = dir.join("ca.pem");
    let ca_key_pem = dir.join("ca-key.pem");
    let ca_key = if ca_pem.is_file() && ca_key_pem.is_file() {
        let pem = std::fs::read_to_string(&ca_key_pem).map_err(|e| format!("read CA key: {e}"))?;
        KeyPair::from_pem(&pem).map_err(|e| format!("parse {}: {e}", ca_key_pem.display()))?
    } else {
        let key = KeyPair::generate().map_err(|e| format!("generate CA key: {e}"))?;
        let cert = ca_params().self_signed(&key).map_err(|e| format!("CA: {e}"))?;
        write_file(&ca_key_pem, &key.serialize_pem())?;
        write_file(&ca_pem, &cert.pem())?;
        key
    };
    let issuer = Issuer::new(ca_params(), ca_key);

    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "kube-apiserver");
    params.distinguished_name = dn;
    let mut names: Vec<String> = sans.to_vec();
    names.extend(["127.0.0.1", "::1", "localhost"].map(String::from));
    certs::add_sans(&mut params, &names).map_err(|e| format!("--san {e}"))?;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().map_err(|e| format!("generate server key: {e}"))?;
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(|e| format!("server certificate: {e}"))?;
    write_file(&dir.join("server-key.pem"), &key.serialize_pem())?;
    write_file(&dir.join("server.pem"), &cert.pem())?;
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    Ok((vec![cert.der().clone()], key))
}

/// The TLS acceptor: ALPN `h2` and `http/1.1`, the certificate issued for `sans`.
pub fn tls_acceptor(dir: &Path, sans: &[String]) -> Result<TlsAcceptor, String> {
    let (chain, key) = certificates(dir, sans)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS versions: {e}"))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| format!("TLS config: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}
