"""What a spec-launched sandbox sees of the host's system, and the secrets in it.

Rules:
- ``SYSTEM_BASE`` is bound read-only into every spec-launched sandbox.
- Every ``ETC_SECRETS`` entry that exists is hidden (globs matched at launch).

Its own module (no imports) so that ``spec.py`` can ask what a sandbox would
show without importing the spec plan, which imports ``spec.py``.
"""

from __future__ import annotations

SYSTEM_BASE: tuple[str, ...] = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
)

# (entry, what it holds). Globs are matched against what exists at launch.
ETC_SECRETS: tuple[tuple[str, str], ...] = (
    ("/etc/shadow", "password hashes"),
    ("/etc/shadow-", "password hashes (backup)"),
    ("/etc/gshadow", "group password hashes"),
    ("/etc/gshadow-", "group password hashes (backup)"),
    ("/etc/security/opasswd", "old password hashes"),
    ("/etc/sudoers", "sudo rules"),
    ("/etc/sudoers.d", "sudo rules"),
    ("/etc/ssh/ssh_host_*_key", "SSH host private keys"),
    ("/etc/ssl/private", "TLS private keys"),
    ("/etc/pki/tls/private", "TLS private keys"),
    ("/etc/letsencrypt", "TLS certificates and private keys"),
    ("/etc/krb5.keytab", "Kerberos host keys"),
    ("/etc/ipsec.secrets", "IPsec secrets"),
    ("/etc/wireguard", "WireGuard private keys"),
    ("/etc/openvpn", "VPN keys"),
    ("/etc/NetworkManager/system-connections", "Wi-Fi and VPN passwords"),
    ("/etc/wpa_supplicant", "Wi-Fi passwords"),
    ("/etc/ppp/chap-secrets", "PPP passwords"),
    ("/etc/ppp/pap-secrets", "PPP passwords"),
    ("/etc/credstore", "systemd credentials"),
    ("/etc/credstore.encrypted", "systemd credentials"),
    ("/etc/mysql/debian.cnf", "database maintenance password"),
    ("/etc/ldap.secret", "LDAP bind password"),
    ("/etc/libvirt/secrets", "libvirt secrets"),
    ("/etc/docker/key.json", "Docker daemon key"),
    ("/etc/kubernetes", "cluster credentials"),
    ("/etc/rancher", "cluster credentials"),
)
