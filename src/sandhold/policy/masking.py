"""The masks of one launch: what a sandbox is shown for each masked secret, and what goes back.

Both plans (``cliplan`` for a settings file, ``specplan`` for a ``SandboxSpec``)
call ``plan_masks``; nothing else mints placeholders.

Rules (F-CRED-2):
- A masked variable the caller has a value for is shown as its placeholder
  (``placeholders.mask``); one with no value is left out (nothing to protect).
  With no entropy source every masked variable is withheld, and said.
- A masked file the caller could read (``file_texts``: text, or None for one
  that is missing, a symlink, too large or not UTF-8) is shown as its masked
  copy; one it could not read stays denied, and said. Its real path is denied
  by the caller's plan either way.
- ``extract``/``decode`` that find nothing: ``onExtractNoMatch: error`` raises
  ``CredentialsProblem`` naming ``<entry>.onExtractNoMatch``; ``warn`` and
  ``deny`` leave the variable withheld (or the file denied), which is stricter
  than srt's ``warn`` (it would pass the real value), and say so.
- One ``Minter`` per launch, so no two placeholders of a run nest.
- A masked AWS pair whose key id and secret both got placeholders becomes an
  ``AwsKeys`` (the proxy re-signs requests signed with its placeholder key id).
- Pure: values, texts and entropy come in as arguments.
"""

from __future__ import annotations

from sandhold._record import record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from sandhold.policy.credentials import AwsPair, CredentialSource
    from sandhold.policy.placeholders import AwsKeys, Injection


@record
class MaskPlan:
    """What ``plan_masks`` decided: the sandbox's side (``env``, ``files``) and the proxy's."""

    env: tuple[tuple[str, str], ...] = ()  # (variable, the value the sandbox sees)
    files: tuple[tuple[str, str], ...] = ()  # (absolute path, the text the sandbox sees)
    injections: tuple[Injection, ...] = ()
    aws_keys: tuple[AwsKeys, ...] = ()
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def plan_masks(
    sources: Sequence[CredentialSource],
    aws_pairs: Sequence[AwsPair],
    *,
    values: Mapping[str, str],
    file_texts: Mapping[str, str | None],
    entropy: Callable[[int], bytes] | None,
    absolute: Callable[[str], str],
    files: bool = True,
) -> MaskPlan:
    """Mask every masked source (module rules).

    Args:
        sources: the credentials entries (only ``mode: mask`` ones are looked at).
        aws_pairs: the masked AWS pairs (``Credentials.aws_pairs``).
        values: the real value of each variable the caller has (its environment).
        file_texts: each masked file's text by absolute path (None: unreadable).
        entropy: ``entropy(n) -> n bytes`` (``os.urandom``), or None.
        absolute: a file entry's path as an absolute path.
        files: whether masked files can be shown (False: backend none).

    Raises:
        CredentialsProblem: ``onExtractNoMatch: error`` and nothing matched.
        RuntimeError: the entropy source repeats itself.
    """
    from sandhold.policy.credentials import CredentialsProblem
    from sandhold.policy.placeholders import Minter, mask

    minter = Minter(entropy) if entropy is not None else None
    env: list[tuple[str, str]] = []
    shown: list[tuple[str, str]] = []
    rows: list[Injection] = []
    warnings: list[str] = []
    notes: list[str] = []
    for src in sources:
        if src.mode != "mask" or (src.kind == "file" and not files):
            continue
        if src.kind == "env":
            if src.target not in values:
                continue  # unset: nothing to protect
            if minter is None:
                warnings.append(
                    f"{src.key}: no entropy for a placeholder; {src.target} is withheld"
                )
                continue
            text: str | None = values[src.target]
            path = ""
        else:
            path = absolute(src.target)
            text = file_texts.get(path)
            if text is None or minter is None:
                warnings.append(
                    f"{src.key}: {src.target} is not a regular UTF-8 file sandhold could read "
                    "(or is a symlink); it is denied for reading instead of masked"
                )
                continue
        assert text is not None
        masked = mask(src, text, minter)
        if masked.no_match:
            what = "the JWT" if src.decode else "extract"
            where = f"{src.target}"
            if src.on_no_match == "error":
                raise CredentialsProblem(
                    f"{src.key}.onExtractNoMatch",
                    f"{what} found nothing to mask in {where} (onExtractNoMatch: error)",
                )
            # srt's "warn" passes the real value; here it stays withheld or denied
            fate = "it is withheld" if src.kind == "env" else "it is denied"
            warnings.append(f"{src.key}: {what} found nothing to mask in {where}; {fate}")
            continue
        rows.extend(masked.injections)
        if src.kind == "env":
            env.append((src.target, masked.text))
        else:
            shown.append((path, masked.text))
            notes.append(
                f"masked credential file {path}: the sandbox sees a copy with placeholders"
            )
    return MaskPlan(
        env=tuple(env),
        files=tuple(shown),
        injections=tuple(rows),
        aws_keys=_aws_keys(sources, aws_pairs, rows),
        warnings=tuple(warnings),
        notes=tuple(notes),
    )


def _aws_keys(
    sources: Sequence[CredentialSource],
    pairs: Sequence[AwsPair],
    injections: Sequence[Injection],
) -> tuple[AwsKeys, ...]:
    """The masked AWS pairs whose members all got placeholders, as ``AwsKeys``."""
    if not pairs:
        return ()
    from sandhold.policy.placeholders import AwsKeys

    keys_of = {s.target: s.key for s in sources if s.kind == "env" and s.mode == "mask"}
    rows = {i.name: i for i in injections}
    out: list[AwsKeys] = []
    for pair in pairs:
        key_id = rows.get(keys_of.get(pair.access_key_id_var, ""))
        secret = rows.get(keys_of.get(pair.secret_access_key_var, ""))
        token = rows.get(keys_of.get(pair.session_token_var or "", ""))
        if key_id is None or secret is None:
            continue  # unset: nothing signs with it
        out.append(
            AwsKeys(
                key_id.placeholder,
                key_id.real,
                secret.real,
                token.real if token is not None else None,
                key_id.hosts,
            )
        )
    return tuple(out)


def describe(injections: Sequence[Injection]) -> tuple[str, ...]:
    """One line per placeholder for ``--explain``: its entry, the placeholder and its
    hosts (never the real value)."""
    return tuple(
        f"{i.name}: placeholder {i.placeholder} put back only at {', '.join(i.hosts)}"
        for i in injections
    )
