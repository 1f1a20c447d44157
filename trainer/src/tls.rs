//! TLS on the report channel where it leaves the machine (the Slurm
//! modes): the driver makes a certificate authority of its own at start,
//! signs the report server's certificate with it and drops the
//! authority's key; ranks get the authority's certificate
//! (PEM, public) in their run's plan (`channel.tls_ca`) and
//! accept no other server. The server's key never leaves the driver's
//! memory. Every message still carries the run's token: TLS keeps it from
//! anyone watching the network, the token says which run a sender is.

use std::time::Duration;

/// The name the report server's certificate is made out to, and which
/// clients check (whatever host or address they dial: the driver's
/// advertised name may be an alias, an IP or a name of the login node).
pub const SERVER_NAME: &str = "nestor-report";

/// The variable that carries the authority's certificate to the ranks.
pub const CA_VAR: &str = "NESTOR_TLS_CA";

/// How long a connection may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Makes ring rustls' process-wide crypto provider, once. The HTTP
/// clients (the object stores', MLflow's) are built without one of their
/// own, so that the build holds one TLS implementation; call this before
/// making one.
pub fn install_crypto() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Another part of the process may have installed one first: that one is used.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// A driver's TLS identity: the server's certificate and key, and the
/// certificate of the authority (made for this driver alone) that signed it.
pub struct ReportTls {
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
}

impl std::fmt::Debug for ReportTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key is never printed.
        f.debug_struct("ReportTls").field("server_name", &SERVER_NAME).finish_non_exhaustive()
    }
}

impl ReportTls {
    /// A new authority and a server certificate signed by it (ECDSA
    /// P-256). Their validity is rcgen's wide default: a node whose clock
    /// is off still accepts them, and they are worth nothing once the
    /// driver (the only holder of the key) is gone.
    pub fn generate() -> Result<Self, rcgen::Error> {
        use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose};
        let ca_key = KeyPair::generate()?;
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.distinguished_name.push(DnType::CommonName, "nestor report channel authority");
        ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let ca_cert = ca.self_signed(&ca_key)?;
        let issuer = rcgen::Issuer::new(ca, ca_key);

        let key = KeyPair::generate()?;
        let mut server = CertificateParams::new(vec![SERVER_NAME.to_string()])?;
        server.distinguished_name.push(DnType::CommonName, SERVER_NAME);
        server.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = server.signed_by(&key, &issuer)?;
        Ok(Self { ca_pem: ca_cert.pem(), cert_pem: cert.pem(), key_pem: key.serialize_pem() })
    }

    /// The authority's certificate (PEM): what ranks trust.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The server side's configuration.
    pub(crate) fn server_config(&self) -> tonic::transport::ServerTlsConfig {
        tonic::transport::ServerTlsConfig::new()
            .identity(tonic::transport::Identity::from_pem(&self.cert_pem, &self.key_pem))
            .timeout(HANDSHAKE_TIMEOUT)
    }
}

/// A client endpoint for the report server at `addr` (`NESTOR_ADDR`):
/// over TLS, trusting only the authority in `ca` (PEM), when `addr` is
/// `https://`; plaintext on `http://` (the driver's own machine).
pub fn endpoint(addr: &str, ca: Option<&str>) -> Result<tonic::transport::Endpoint, String> {
    let endpoint = tonic::transport::Endpoint::from_shared(addr.to_string()).map_err(|e| format!("the driver's address {addr:?}: {e}"))?;
    if !addr.starts_with("https://") {
        return Ok(endpoint);
    }
    let Some(ca) = ca.filter(|c| !c.trim().is_empty()) else {
        return Err(format!("the driver's address {addr:?} is TLS, but the run's plan names no certificate authority (channel.tls_ca; {CA_VAR} in an older plan)"));
    };
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(ca))
        .domain_name(SERVER_NAME)
        .timeout(HANDSHAKE_TIMEOUT);
    endpoint.tls_config(tls).map_err(|e| format!("the certificate authority in the run's plan: {e}"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::proto::reporter_client::ReporterClient;
    use crate::proto::ReportRequest;
    use crate::service::ReportServer;

    fn request(token: &str) -> ReportRequest {
        ReportRequest {
            version: 1,
            trial_id: "t1".into(),
            token: token.into(),
            metrics: [("loss".to_string(), 0.5)].into_iter().collect(),
            ..ReportRequest::default()
        }
    }

    /// A rank that trusts the driver's authority reports; one dialling in
    /// plaintext, or trusting another driver's authority (a server in the
    /// middle with a certificate of its own), gets no connection, so
    /// nothing it sends (the token above all) leaves it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ranks_reach_only_the_driver_whose_authority_they_were_given() {
        let server = ReportServer::start_encrypted(std::net::SocketAddr::from(([127, 0, 0, 1], 0))).await.unwrap();
        let other = ReportServer::start_encrypted(std::net::SocketAddr::from(([127, 0, 0, 1], 0))).await.unwrap();
        assert_ne!(server.ca_pem(), other.ca_pem(), "every driver makes its own authority");
        let dir = tempfile::tempdir().unwrap();
        let spec = crate::LaunchSpec::new("t1", serde_json::json!({}), dir.path());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let _reg = server.register(&spec, "secret".into(), spec.roots(None), tx);

        let good = endpoint(&server.url(), server.ca_pem()).unwrap().connect().await.unwrap();
        let mut client = ReporterClient::new(good);
        let answer = tokio::spawn(async move { client.report(request("secret")).await });
        let event = rx.recv().await.unwrap();
        let crate::EventKind::Report { reply, .. } = event.kind else { panic!("a report") };
        reply.send(crate::Directive::Continue).durable();
        answer.await.unwrap().unwrap();

        let wrong = endpoint(&server.url(), other.ca_pem()).unwrap().connect().await;
        assert!(wrong.is_err(), "a client trusting another authority connected");
        let plain = format!("http://{}", server.addr());
        let mut client = ReporterClient::new(endpoint(&plain, None).unwrap().connect().await.unwrap());
        assert!(client.report(request("secret")).await.is_err(), "a plaintext call was answered");
        // TLS named without its authority is a clear error before any connection.
        let err = endpoint(&server.url(), None).unwrap_err();
        assert!(err.contains(CA_VAR), "{err}");
        assert!(rx.try_recv().is_err(), "a refused client reached the driver");
    }
}
