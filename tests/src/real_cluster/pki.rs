//! The cluster's certificates and credentials: a CA, certificates it signs (the apiserver's
//! serving certificate is *not* its own CA: rustls rejects that), the service-account key pair,
//! and random bearer tokens.
use std::{
    fs,
    io::Read,
    path::{Path, PathBuf},
};

use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, Issuer, KeyPair, KeyUsagePurpose,
};

use crate::certs;

/// A CA whose files live in one directory, and what it signs.
pub struct Pki {
    dir: PathBuf,
    issuer: Issuer<'static, KeyPair>,
}

/// What a certificate is for.
pub enum Profile<'a> {
    /// A TLS server: IP and DNS subject alternative names.
    Server { sans: &'a [String] },
    /// A TLS client: Kubernetes reads the user from the CN and the groups from O.
    Client { user: &'a str, groups: &'a [&'a str] },
}

/// A certificate and its key, as PEM files.
#[derive(Clone, Debug)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl CertFiles {
    /// Certificate then key in one PEM file (what haproxy's `crt` wants), written next to them.
    pub fn combined(&self) -> PathBuf {
        let path = self.cert.with_extension("combined.pem");
        let mut pem = fs::read(&self.cert).expect("read certificate");
        pem.extend(fs::read(&self.key).expect("read key"));
        write(&path, &pem);
        path
    }
}

fn write(path: &Path, contents: &[u8]) {
    fs::write(path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

fn ca_params() -> CertificateParams {
    certs::ca_params("lifeline-real-cluster-ca")
}

impl Pki {
    /// A fresh CA in `dir` (`ca.pem`), and the service-account key pair (`sa.key`, PKCS#8, for
    /// signing; `sa.pub`, for verifying: client-go's key reader takes EC public keys only from a
    /// `PUBLIC KEY` block).
    pub fn create(dir: &Path) -> Pki {
        fs::create_dir_all(dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        let key = KeyPair::generate().expect("generate the CA key");
        let cert = ca_params().self_signed(&key).expect("self-sign the CA");
        write(&dir.join("ca.pem"), cert.pem().as_bytes());
        let sa = KeyPair::generate().expect("generate the service-account key");
        write(&dir.join("sa.key"), sa.serialize_pem().as_bytes());
        write(&dir.join("sa.pub"), sa.public_key_pem().as_bytes());
        Pki {
            dir: dir.to_path_buf(),
            issuer: Issuer::new(ca_params(), key),
        }
    }

    pub fn ca_pem(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// The service-account signing key (PKCS#8 PEM).
    pub fn sa_key(&self) -> PathBuf {
        self.dir.join("sa.key")
    }

    /// The service-account verifying key (SubjectPublicKeyInfo PEM).
    pub fn sa_pub(&self) -> PathBuf {
        self.dir.join("sa.pub")
    }

    /// Issues `NAME.pem` and `NAME-key.pem`, signed by the CA.
    pub fn issue(&self, name: &str, profile: Profile) -> CertFiles {
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        match profile {
            Profile::Server { sans } => {
                dn.push(DnType::CommonName, name);
                certs::add_sans(&mut params, sans).unwrap_or_else(|e| panic!("SAN {e}"));
                params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
            }
            Profile::Client { user, groups } => {
                dn.push(DnType::CommonName, user);
                for group in groups {
                    dn.push(DnType::OrganizationName, *group);
                }
                params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            }
        }
        params.distinguished_name = dn;
        let key = KeyPair::generate().expect("generate a key");
        let cert = params
            .signed_by(&key, &self.issuer)
            .unwrap_or_else(|e| panic!("sign {name}: {e}"));
        let files = CertFiles {
            cert: self.dir.join(format!("{name}.pem")),
            key: self.dir.join(format!("{name}-key.pem")),
        };
        write(&files.cert, cert.pem().as_bytes());
        write(&files.key, key.serialize_pem().as_bytes());
        files
    }
}

/// A random bearer token: 32 hex digits from the kernel's random source.
pub fn token() -> String {
    let mut bytes = [0u8; 16];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .expect("read /dev/urandom");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serving_certificate_is_signed_by_a_separate_ca() {
        let dir = std::env::temp_dir().join(format!("ll-pki-test-{}", std::process::id()));
        let pki = Pki::create(&dir);
        let sans = ["10.231.0.1".to_owned(), "kubernetes.default.svc".to_owned()];
        let files = pki.issue("apiserver", Profile::Server { sans: &sans });
        let out = std::process::Command::new("openssl")
            .args(["verify", "-CAfile"])
            .arg(pki.ca_pem())
            .arg(&files.cert)
            .output();
        // openssl is optional on a test machine; where it exists, it must agree.
        if let Ok(out) = out {
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        }
        let pem = fs::read_to_string(&files.cert).unwrap();
        assert_ne!(pem, fs::read_to_string(pki.ca_pem()).unwrap());
        assert!(fs::read_to_string(pki.sa_pub())
            .unwrap()
            .starts_with("-----BEGIN PUBLIC KEY-----"));
        assert_eq!(token().len(), 32);
        assert_ne!(token(), token());
        let _ = fs::remove_dir_all(&dir);
    }
}
