//! Where webhooks may not post: link-local addresses and the cloud metadata endpoints. A URL naming one is
//! refused when the config is read; a name that resolves to one is refused when a delivery connects.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use reqwest::Url;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// Host names of metadata services, refused whatever they resolve to.
const METADATA_NAMES: [&str; 1] = ["metadata.google.internal"];
/// Metadata addresses: the one most clouds use (also link-local), and Alibaba Cloud's.
const METADATA_V4: [Ipv4Addr; 2] = [Ipv4Addr::new(169, 254, 169, 254), Ipv4Addr::new(100, 100, 100, 200)];
/// Metadata addresses over IPv6: AWS's (Nitro instances).
const METADATA_V6: [Ipv6Addr; 1] = [Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)];

/// What makes an address unreachable for webhooks, or `None` when it may be reached.
pub fn refusal(ip: IpAddr) -> Option<&'static str> {
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    match ip {
        IpAddr::V4(v4) if METADATA_V4.contains(&v4) => Some("a cloud metadata address"),
        IpAddr::V4(v4) if v4.is_link_local() => Some("a link-local address"),
        IpAddr::V6(v6) if METADATA_V6.contains(&v6) => Some("a cloud metadata address"),
        IpAddr::V6(v6) if v6.is_unicast_link_local() => Some("a link-local address"),
        _ => None,
    }
}

/// Why a URL's host is refused: it is a metadata service's name, or a link-local or metadata address.
pub fn host_refusal(url: &Url) -> Option<String> {
    let host = url.host_str()?;
    let bare = host
        .strip_prefix('[')
        .and_then(|host| host.strip_suffix(']'))
        .unwrap_or(host);
    match bare.parse::<IpAddr>() {
        Ok(ip) => refusal(ip).map(|why| format!("{bare} is {why}")),
        Err(_) => is_metadata_name(host).then(|| format!("{host} is a cloud metadata service")),
    }
}

fn is_metadata_name(name: &str) -> bool {
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    METADATA_NAMES.contains(&name.as_str())
}

/// A DNS resolver that fails a name resolving to any link-local or metadata address ([`guarded_lookup`]), so that
/// a name in a webhook's URL cannot lead a delivery where a literal address could not. It resolves like the default
/// (the system's `getaddrinfo` on a blocking thread); a URL naming an address is not resolved, and is
/// checked when the config is read instead.
#[derive(Debug, Clone, Copy, Default)]
pub struct GuardedResolver;

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let addresses = match guarded_lookup(&host, 0).await {
                Ok(addresses) => addresses,
                Err(Lookup::Refused(refused)) => return Err(refused.into()),
                Err(Lookup::Failed(error)) => return Err(error.into()),
            };
            let addresses: Addrs = Box::new(addresses.into_iter());
            Ok(addresses)
        })
    }
}

/// Why [`guarded_lookup`] gave no addresses.
#[derive(Debug)]
pub enum Lookup {
    Refused(Refused),
    Failed(std::io::Error),
}

/// The addresses `host` resolves to, with `port`; refused when it is a metadata name or resolves to any
/// link-local or metadata address.
pub async fn guarded_lookup(host: &str, port: u16) -> Result<Vec<SocketAddr>, Lookup> {
    if is_metadata_name(host) {
        return Err(Lookup::Refused(Refused::new(
            host.to_owned(),
            None,
            "a cloud metadata service",
        )));
    }
    let addresses: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
        .await
        .map_err(Lookup::Failed)?
        .collect();
    let refused = addresses
        .iter()
        .find_map(|address| refusal(address.ip()).map(|why| (address.ip(), why)));
    if let Some((address, why)) = refused {
        return Err(Lookup::Refused(Refused::new(host.to_owned(), Some(address), why)));
    }
    Ok(addresses)
}

/// A name refused by [`guarded_lookup`]; its message is a webhook's.
#[derive(Debug, thiserror::Error)]
#[error(
    "{}: webhooks do not post there unless the webhook sets allow_link_local = true",
    self.reason()
)]
pub struct Refused {
    host: String,
    address: Option<IpAddr>,
    why: &'static str,
}

impl Refused {
    fn new(host: String, address: Option<IpAddr>, why: &'static str) -> Self {
        Self { host, address, why }
    }

    /// What was refused and why, such as `"169.254.169.254 resolves to 169.254.169.254, which is a cloud
    /// metadata address"`.
    pub fn reason(&self) -> String {
        let resolved = self
            .address
            .map(|address| format!(" resolves to {address}, which"))
            .unwrap_or_default();
        format!("{}{resolved} is {}", self.host, self.why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(url: &str) -> Option<String> {
        host_refusal(&Url::parse(url).unwrap())
    }

    #[test]
    fn link_local_and_metadata_hosts_are_refused() {
        for url in [
            "http://169.254.169.254/latest/meta-data/",
            "http://169.254.1.1:8080/hook",
            "http://2852039166/",
            "http://[fe80::1]/hook",
            "http://[febf::1]/hook",
            "http://[fd00:ec2::254]/",
            "http://[::ffff:169.254.169.254]/",
            "http://100.100.100.200/latest/meta-data/",
            "http://metadata.google.internal/computeMetadata/v1/",
            "https://METADATA.google.internal./",
        ] {
            assert!(refused(url).is_some(), "{url} was not refused");
        }
        assert_eq!(
            refused("http://169.254.169.254/").as_deref(),
            Some("169.254.169.254 is a cloud metadata address")
        );
    }

    #[test]
    fn other_hosts_pass() {
        for url in [
            "http://127.0.0.1:9/hook",
            "http://10.0.0.1/hook",
            "http://100.100.100.201/",
            "http://[::1]/hook",
            "http://[fec0::1]/hook",
            "https://hooks.example.com/x",
            "http://metadata.google.internal.example.com/",
        ] {
            assert_eq!(refused(url), None, "{url}");
        }
    }

    #[tokio::test]
    async fn the_resolver_refuses_what_resolves_to_a_refused_address() {
        let error = GuardedResolver
            .resolve("169.254.169.254".parse().unwrap())
            .await
            .err()
            .expect("refused");
        assert_eq!(
            error.to_string(),
            "169.254.169.254 resolves to 169.254.169.254, which is a cloud metadata address: webhooks do not \
             post there unless the webhook sets allow_link_local = true"
        );
        let error = GuardedResolver
            .resolve("metadata.google.internal".parse().unwrap())
            .await
            .err()
            .expect("refused without resolving");
        assert!(error.to_string().contains("metadata service"), "{error}");
        let resolved: Vec<SocketAddr> = GuardedResolver
            .resolve("127.0.0.1".parse().unwrap())
            .await
            .unwrap()
            .collect();
        assert_eq!(resolved, ["127.0.0.1:0".parse().unwrap()]);
    }
}
