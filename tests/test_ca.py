"""sandhold's TLS termination CA: made once, private, refused when it is not (F-CRED-3)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from sandhold.net.ca import CaError, CertificateAuthority, certificate_blocks, trust_bundle
from sandhold.policy.credentials import default_ca_dir


def test_made_once_private_and_reused(tmp_path: Path) -> None:
    d = tmp_path / "state" / "sandhold" / "ca"
    first = CertificateAuthority.load_or_create(str(d))
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(d / "ca-key.pem").st_mode) == 0o600
    again = CertificateAuthority.load_or_create(str(d))
    assert again.cert_pem == first.cert_pem
    assert sorted(p.name for p in d.iterdir()) == ["ca-key.pem", "ca.pem"]  # no temporaries


def test_a_key_others_can_read_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "ca"
    CertificateAuthority.load_or_create(str(d))
    os.chmod(d / "ca-key.pem", 0o644)
    with pytest.raises(CaError, match="mode 0600"):
        CertificateAuthority.load_or_create(str(d))
    os.chmod(d / "ca-key.pem", 0o600)
    os.chmod(d, 0o755)
    with pytest.raises(CaError, match="private"):
        CertificateAuthority.load_or_create(str(d))


def test_the_users_own_pair_and_bad_files(tmp_path: Path) -> None:
    d = tmp_path / "ca"
    made = CertificateAuthority.load_or_create(str(d))
    mine = CertificateAuthority.load_pair(str(d / "ca.pem"), str(d / "ca-key.pem"))
    assert mine.cert_pem == made.cert_pem
    (tmp_path / "junk.pem").write_text("not a certificate")
    with pytest.raises(CaError, match="not a PEM"):
        CertificateAuthority.load_pair(str(tmp_path / "junk.pem"), str(d / "ca-key.pem"))
    with pytest.raises(CaError, match="cannot be read"):
        CertificateAuthority.load_pair(str(tmp_path / "missing.pem"), str(d / "ca-key.pem"))


def test_trust_bundle_has_the_ca_then_roots_then_extras(tmp_path: Path) -> None:
    ca = CertificateAuthority.load_or_create(str(tmp_path / "ca"))
    extra = tmp_path / "extra.pem"
    extra.write_bytes(b"junk\n" + ca.cert_pem + b"more junk\n")
    bundle, notes = trust_bundle(ca, [str(extra), str(tmp_path / "absent.pem")])
    blocks = certificate_blocks(bundle)
    assert blocks[0] == ca.cert_pem and blocks[-1] == ca.cert_pem and len(blocks) > 2
    assert any("absent.pem" in n for n in notes)


def test_leaves_are_cached_per_host(tmp_path: Path) -> None:
    ca = CertificateAuthority.load_or_create(str(tmp_path / "ca"))
    a = ca.server_context("api.example.com")
    assert ca.server_context("api.example.com") is a
    assert ca.server_context("127.0.0.1") is not a


@pytest.mark.parametrize(
    ("home", "xdg", "expected"),
    [
        ("/home/u", None, "/home/u/.local/state/sandhold/ca"),
        ("/home/u/", "/x/state", "/x/state/sandhold/ca"),
        ("/home/u", "relative", "/home/u/.local/state/sandhold/ca"),
    ],
)
def test_default_ca_dir(home: str, xdg: str | None, expected: str) -> None:
    assert default_ca_dir(home, xdg) == expected
