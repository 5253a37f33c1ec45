"""The certificate authority of TLS termination: sandhold's own per-install CA, or the user's.

Rules (F-CRED-3):
- X.509 is done by ``cryptography`` (a maintained library), never by hand; it
  is imported only here, and this module only when ``tlsTerminate`` is set.
- Without ``caCertPath``/``caKeyPath`` the CA is made once per install under
  ``$XDG_STATE_HOME/sandhold/ca`` (``~/.local/state/sandhold/ca``): the
  directory 0700, the key 0600, written to a temporary name and renamed into
  place so that two first runs cannot leave half a key. A key file that is not
  the user's own or is readable by others is refused, not used. The plan denies
  the sandbox read access to that directory and to ``caKeyPath``.
- Leaf certificates are minted per host (DNS or IP SAN, 7 days, EC P-256),
  signed by the CA and cached (bounded, least recently used out).
- The trust bundle the sandbox is pointed at is the CA, then the system
  bundle, then each ``extraCaCertPaths`` file's CERTIFICATE blocks (a missing
  or unreadable extra file is skipped and said).
- Errors are ``CaError`` with the path and what is wrong; key material never
  appears in a message.
"""

from __future__ import annotations

import os
import ssl
import stat
import tempfile
from collections import OrderedDict

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

CA_NAME = "sandhold TLS termination CA"
CA_DAYS = 3650
LEAF_DAYS = 7
MAX_LEAVES = 1024
# where the system's roots are when Python's build does not say
_SYSTEM_BUNDLES = (
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
)


class CaError(Exception):
    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"TLS termination CA {path}: {why}")
        self.path = path
        self.why = why


class CertificateAuthority:
    """A CA certificate and key in memory, minting leaf contexts for the proxy."""

    def __init__(self, cert_pem: bytes, key_pem: bytes, source: str) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization

        try:
            self._cert = x509.load_pem_x509_certificate(cert_pem)
            self._key = serialization.load_pem_private_key(key_pem, password=None)
        except (ValueError, TypeError) as exc:
            raise CaError(
                source, f"not a PEM certificate and unencrypted key ({type(exc).__name__})"
            ) from None
        self.cert_pem = self._cert.public_bytes(serialization.Encoding.PEM)
        self.source = source
        self._leaves: OrderedDict[str, ssl.SSLContext] = OrderedDict()

    # -- making and loading -----------------------------------------------------

    @classmethod
    def load_pair(cls, cert_path: str, key_path: str) -> CertificateAuthority:
        """The user's own ``caCertPath``/``caKeyPath``."""
        return cls(_read(cert_path), _read(key_path), cert_path)

    @classmethod
    def load_or_create(cls, directory: str) -> CertificateAuthority:
        """sandhold's per-install CA in ``directory``, made on first use (module rules)."""
        cert_path, key_path = f"{directory}/ca.pem", f"{directory}/ca-key.pem"
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise CaError(directory, f"cannot be made: {exc.strerror}") from None
        st = os.lstat(directory)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise CaError(directory, f"is not a directory private to uid {os.geteuid()}")
        if not os.path.exists(key_path):
            cert_pem, key_pem = _new_ca()
            # the key first, then the certificate: a certificate is only ever beside its key
            _write_private(directory, key_path, key_pem)
            _write_private(directory, cert_path, cert_pem)
        _check_private(key_path)
        return cls(_read(cert_path), _read(key_path), cert_path)

    # -- leaves -------------------------------------------------------------------

    def server_context(self, host: str) -> ssl.SSLContext:
        """A server-side context presenting a leaf for ``host`` (cached), ALPN http/1.1."""
        ctx = self._leaves.get(host)
        if ctx is not None:
            self._leaves.move_to_end(host)
            return ctx
        cert_pem, key_pem = self._leaf(host)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_alpn_protocols(["http/1.1"])  # the only protocol the proxy speaks inside
        # ssl loads a chain only from files: a private directory, removed at once
        with tempfile.TemporaryDirectory(prefix="sandhold-leaf-") as d:
            path = f"{d}/leaf.pem"
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(cert_pem + self.cert_pem + key_pem)
            ctx.load_cert_chain(path)
        self._leaves[host] = ctx
        while len(self._leaves) > MAX_LEAVES:
            self._leaves.popitem(last=False)
        return ctx

    def _leaf(self, host: str) -> tuple[bytes, bytes]:
        import datetime
        import ipaddress

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        try:
            san: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(host))
        except ValueError:
            san = x509.DNSName(host)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host[:64])]))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=LEAF_DAYS))
            .add_extension(x509.SubjectAlternativeName([san]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._cert.public_key()),  # type: ignore[arg-type]
                critical=False,
            )
            .sign(self._key, hashes.SHA256())  # type: ignore[arg-type]
        )
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        return cert.public_bytes(serialization.Encoding.PEM), key_pem


def prepare(
    ca_cert_path: str | None, ca_key_path: str | None, ca_dir: str, extra_paths: Sequence[str]
) -> tuple[CertificateAuthority, bytes, list[str]]:
    """The CA a launch terminates TLS with (the user's pair, else the per-install one
    in ``ca_dir``, made on first use) and the sandbox's trust bundle, with its notes.

    Raises:
        LaunchError: the CA cannot be read, made or trusted, or ``cryptography`` is
            missing (step "tls termination CA"; no key material in the message).
    """
    from sandhold.errors import LaunchError

    try:
        if ca_cert_path is not None and ca_key_path is not None:
            ca = CertificateAuthority.load_pair(
                os.path.expanduser(ca_cert_path), os.path.expanduser(ca_key_path)
            )
        else:
            ca = CertificateAuthority.load_or_create(ca_dir)
        bundle, notes = trust_bundle(ca, [os.path.expanduser(p) for p in extra_paths])
    except CaError as exc:
        raise LaunchError("native", "tls termination CA", str(exc)) from exc
    except ImportError as exc:
        raise LaunchError(
            "native", "tls termination CA", f"the 'cryptography' package is needed ({exc})"
        ) from exc
    return ca, bundle, notes


def trust_bundle(ca: CertificateAuthority, extra_paths: Sequence[str]) -> tuple[bytes, list[str]]:
    """The bundle for the sandbox (module rules) and the notes about skipped files."""
    parts = [ca.cert_pem]
    notes: list[str] = []
    system = system_bundle()
    if system is not None:
        parts.append(_read(system))
    for path in extra_paths:
        try:
            blocks = certificate_blocks(_read(path))
        except CaError as exc:
            notes.append(f"tlsTerminate.extraCaCertPaths: {path} skipped: {exc.why}")
            continue
        if not blocks:
            notes.append(f"tlsTerminate.extraCaCertPaths: {path} skipped: no PEM CERTIFICATE block")
        parts.extend(blocks)
    return b"\n".join(p.rstrip(b"\n") + b"\n" for p in parts), notes


def certificate_blocks(pem: bytes) -> list[bytes]:
    out: list[bytes] = []
    begin, end = b"-----BEGIN CERTIFICATE-----", b"-----END CERTIFICATE-----"
    i = 0
    while (j := pem.find(begin, i)) >= 0 and (k := pem.find(end, j)) >= 0:
        out.append(pem[j : k + len(end)] + b"\n")
        i = k + len(end)
    return out


def system_bundle() -> str | None:
    paths = ssl.get_default_verify_paths()
    for candidate in (paths.cafile, paths.openssl_cafile, *_SYSTEM_BUNDLES):
        if candidate and os.path.isfile(candidate):
            return candidate
    return None


def upstream_context(extra_paths: Sequence[str]) -> ssl.SSLContext:
    """The client side towards the real host: system roots plus ``extraCaCertPaths``,
    hostname checked, ALPN http/1.1 only."""
    ctx = ssl.create_default_context()
    ctx.set_alpn_protocols(["http/1.1"])
    for path in extra_paths:
        try:
            blocks = certificate_blocks(_read(path))
        except CaError:
            continue  # said once in trust_bundle's notes; a missing root trusts less
        if blocks:
            ctx.load_verify_locations(cadata=b"".join(blocks).decode("ascii"))
    return ctx


def _new_ca() -> tuple[bytes, bytes]:
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, CA_NAME),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, f"sandhold (uid {os.geteuid()})"),
        ]
    )
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(1 << 20)
    except OSError as exc:
        raise CaError(path, f"cannot be read: {exc.strerror}") from None


def _write_private(directory: str, path: str, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")  # 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)  # never replaces a key another first run put there
    except FileExistsError:
        pass  # another run made it first: use theirs
    except OSError as exc:
        raise CaError(path, f"cannot be written: {exc.strerror}") from None
    finally:
        os.unlink(tmp)


def _check_private(path: str) -> None:
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise CaError(path, f"must be a regular file of uid {os.geteuid()} with mode 0600")
