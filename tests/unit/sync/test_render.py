"""Tests for render.py: every format reads back as the input, or refuses loudly.

Round trips are proved with hypothesis over arbitrary unicode, against the readers a
consumer actually uses (python-dotenv from a stream and from a file, json.loads), since
"escaped values" is only true if a real parser agrees.
"""

from __future__ import annotations

import base64
import io
import json

import pytest
from dotenv import dotenv_values
from hypothesis import example, given, settings
from hypothesis import strategies as st

from himitsu_controller.sync.target.render import (
    MAX_SECRET_BYTES,
    RenderError,
    data_hash,
    data_size,
    default_key,
    render,
    valid_data_key,
)

CANARY = "canary-VALUE-7f3a"

# Values: any Unicode scalar value (no lone surrogates, which have no UTF-8 form).
values = st.text(st.characters(codec="utf-8"), max_size=200)
dotenv_values_text = st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=200)
# Keys Himitsu may hand us that a dotenv reader can read back: printable, no space,
# none of = # ' " ` \ (see render._valid_dotenv_key).
dotenv_keys = st.text(
    st.characters(
        codec="utf-8",
        categories=["L", "M", "N", "P", "S"],
        exclude_characters="=#'\"`\\",
    ),
    min_size=1,
    max_size=40,
)
data_keys = st.from_regex(r"[A-Za-z0-9_][-._A-Za-z0-9]{0,40}", fullmatch=True)


def decode(data: dict[str, str]) -> dict[str, str]:
    return {k: base64.b64decode(v, validate=True).decode("utf-8") for k, v in data.items()}


def read_dotenv_stream(text: str) -> dict[str, str | None]:
    return dict(dotenv_values(stream=io.StringIO(text), interpolate=False))


def read_dotenv_file(blob: bytes) -> dict[str, str | None]:
    # What dotenv_values(path) does: a text-mode file, universal newlines on.
    stream = io.TextIOWrapper(io.BytesIO(blob), encoding="utf-8")
    return dict(dotenv_values(stream=stream, interpolate=False))


# --- basics ---------------------------------------------------------------------------


def test_default_keys() -> None:
    assert default_key("KeyValue") is None
    assert default_key("Dotenv") == ".env"
    assert default_key("Json") == "config.json"
    with pytest.raises(RenderError, match="unknown template format 'Yaml'"):
        default_key("Yaml")


def test_unknown_format_is_refused() -> None:
    with pytest.raises(RenderError, match="use KeyValue, Dotenv or Json"):
        render("keyvalue", {"A": "1"})


@pytest.mark.parametrize(
    ("key", "ok"),
    [
        ("A", True),
        ("a.b-c_d", True),
        (".env", True),
        ("..x", False),  # a leading ".." is refused
        ("x..", True),
        ("-", True),
        ("x" * 253, True),
        ("x" * 254, False),
        ("", False),
        (".", False),
        ("..", False),
        ("..env", False),
        ("a b", False),
        ("a/b", False),
        ("a:b", False),
        ("é", False),
        ("A\n", False),  # `$` in a regex would let a trailing newline through
    ],
)
def test_valid_data_key(key: str, ok: bool) -> None:
    assert valid_data_key(key) is ok


def test_keyvalue_renders_one_entry_per_key() -> None:
    data = render("KeyValue", {"B": "two", "A": "", "c.d": "é\n"})
    assert data == {
        "A": "",
        "B": base64.b64encode(b"two").decode(),
        "c.d": base64.b64encode("é\n".encode()).decode(),
    }


def test_keyvalue_ignores_template_key() -> None:
    assert render("KeyValue", {"A": "1"}, key="whatever") == render("KeyValue", {"A": "1"})


def test_dotenv_exact_output() -> None:
    data = render("Dotenv", {"B": 'say "hi"\\\n', "A": "", "C": "$HOME #x 'q'\t"})
    assert list(data) == [".env"]
    assert base64.b64decode(data[".env"]) == (
        b'A=""\nB="say \\"hi\\"\\\\\\n"\nC="$HOME #x \'q\'\t"\n'
    )


def test_json_exact_output() -> None:
    data = render("Json", {"b": "é", "a": "\0"}, key="app.json")
    assert list(data) == ["app.json"]
    assert base64.b64decode(data["app.json"]).decode() == '{\n  "a": "\\u0000",\n  "b": "é"\n}'


def test_empty_environment() -> None:
    assert render("KeyValue", {}) == {}
    assert decode(render("Dotenv", {})) == {".env": ""}
    assert decode(render("Json", {})) == {"config.json": "{}"}


def test_base64_is_standard_alphabet_with_padding() -> None:
    # "?" and "~" bytes produce "/" and "+" in the standard alphabet ("_" and "-" in
    # the urlsafe one); 7 bytes need "==" padding.
    assert render("KeyValue", {"A": "???~~~?"}) == {"A": "Pz8/fn5+Pw=="}


# --- round trips ----------------------------------------------------------------------


@given(st.dictionaries(data_keys, values, max_size=8))
def test_keyvalue_round_trip(secrets: dict[str, str]) -> None:
    assert decode(render("KeyValue", secrets)) == secrets


@given(st.dictionaries(dotenv_keys, dotenv_values_text, max_size=8))
@example({"export": "1", "A": "\r\n\r", "B": "\\", "C": '\\"', "D": "\\n", "E": " x "})
@example({"K": "${HOME}", "L": "#", "M": "'", "N": "", "O": "\ufeff\u2028\x85\x0b"})
@example({"path/to:key": "v", "ünï": "ç", "a$b": "x", "a;b": "y"})
def test_dotenv_round_trip(secrets: dict[str, str]) -> None:
    blob = base64.b64decode(render("Dotenv", secrets)[".env"])
    assert read_dotenv_stream(blob.decode("utf-8")) == secrets
    assert read_dotenv_file(blob) == secrets


@given(st.dictionaries(st.text(st.characters(codec="utf-8"), max_size=20), values, max_size=8))
def test_json_round_trip(secrets: dict[str, str]) -> None:
    data = render("Json", secrets)
    assert json.loads(base64.b64decode(data["config.json"]).decode("utf-8")) == secrets


@given(st.dictionaries(st.text(st.characters(codec="utf-8"), max_size=12), values, max_size=6))
@example({"A B": "1"})
@example({"A=B": "1"})
@example({"#A": "1"})
@example({"'A'": "1"})
@example({"A\tB": "1"})
@example({"A\u00a0B": "1"})
def test_dotenv_never_writes_what_reads_back_differently(secrets: dict[str, str]) -> None:
    """Whatever the keys, Dotenv either refuses or writes something that reads back."""
    try:
        data = render("Dotenv", secrets)
    except RenderError:
        return
    blob = base64.b64decode(data[".env"])
    assert read_dotenv_file(blob) == secrets


@pytest.mark.parametrize(
    "bad",
    [
        "",
        "A B",
        "A=B",
        "#A",
        "A#",
        "'A'",
        "A'",
        '"A"',
        "A`",
        "A\\B",
        "A\tB",
        "A\nB",
        "A\x00",
        "A\u00a0B",
        "\ufeffA",
        "A\u200bB",
        "A\x7f",
    ],
)
def test_dotenv_rejects_unreadable_keys(bad: str) -> None:
    with pytest.raises(RenderError, match="cannot be written as a dotenv key") as err:
        render("Dotenv", {bad: "v", "GOOD": "v"})
    assert err.value.keys == (bad,)
    assert repr(bad) in str(err.value)


def test_unreadable_dotenv_keys_really_misread() -> None:
    """The refusals above are not paranoia: python-dotenv misreads these lines."""
    for key in ["A B", "A=B", "#A", "'A'x", "A\tB"]:
        assert read_dotenv_stream(f'{key}="v"\n') != {key: "v"}


def test_dotenv_rejects_nul_value_naming_the_key() -> None:
    with pytest.raises(RenderError, match="NUL") as err:
        render("Dotenv", {"NULLY": f"{CANARY}\0{CANARY}", "OK": "v"})
    assert err.value.keys == ("NULLY",)
    assert "'NULLY'" in str(err.value)
    # KeyValue and Json carry NUL faithfully.
    assert decode(render("KeyValue", {"NULLY": "a\0b"})) == {"NULLY": "a\0b"}


# --- KeyValue key validation --------------------------------------------------------------


def test_keyvalue_rejects_bad_key_naming_it_and_suggesting_formats() -> None:
    with pytest.raises(RenderError) as err:
        render("KeyValue", {"GOOD": "v", "path/to:key": "v"})
    message = str(err.value)
    assert "'path/to:key'" in message
    assert "Dotenv or Json" in message
    assert err.value.keys == ("path/to:key",)


def test_keyvalue_names_first_bad_keys_sorted_and_counts() -> None:
    bad = {"e e": "v", "a a": "v", "d/d": "v", "b:b": "v", "c c": "v", "OK": "v"}
    with pytest.raises(RenderError) as err:
        render("KeyValue", bad)
    message = str(err.value)
    assert message.startswith("5 keys 'a a', 'b:b', 'c c' and 2 more:")
    assert "d/d" not in message and "e e" not in message
    assert err.value.keys == ("a a", "b:b", "c c", "d/d", "e e")


def test_key_in_message_is_escaped_and_truncated() -> None:
    long_key = "K\n" + "x" * 5000
    with pytest.raises(RenderError) as err:
        render("KeyValue", {long_key: "v"})
    message = str(err.value)
    assert "\n" not in message
    assert "'K\\nxxx" in message
    assert len(message) < 600


@pytest.mark.parametrize("fmt", ["Dotenv", "Json"])
@pytest.mark.parametrize("bad_key", ["", ".", "..", "..x", "a b", "a/b", "x" * 254])
def test_blob_key_must_be_a_valid_data_key(fmt: str, bad_key: str) -> None:
    with pytest.raises(RenderError, match="template key"):
        render(fmt, {"A": "1"}, key=bad_key)


@pytest.mark.parametrize("fmt", ["KeyValue", "Dotenv", "Json"])
def test_lone_surrogates_are_refused(fmt: str) -> None:
    with pytest.raises(RenderError, match="lone surrogate") as err:
        render(fmt, {"A": f"{CANARY}\ud800"})
    assert err.value.keys == ("A",)
    with pytest.raises(RenderError, match="lone surrogate"):
        render(fmt, {"A\udc00": "v"})


# --- determinism ----------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["KeyValue", "Dotenv", "Json"])
@given(secrets=st.dictionaries(data_keys, dotenv_values_text, max_size=8), data=st.data())
def test_output_is_deterministic_and_order_independent(
    fmt: str, secrets: dict[str, str], data: st.DataObject
) -> None:
    shuffled = dict(data.draw(st.permutations(list(secrets.items()))))
    first = render(fmt, secrets)
    assert render(fmt, secrets) == first
    again = render(fmt, shuffled)
    assert again == first
    assert list(again) == list(first)  # even the mapping's iteration order
    assert data_hash(again) == data_hash(first)


# --- size -----------------------------------------------------------------------------


def test_size_exactly_at_the_limit_is_accepted() -> None:
    chunk = 64 * 1024
    secrets = {f"K{i:02d}": "x" * chunk for i in range(MAX_SECRET_BYTES // chunk)}
    data = render("KeyValue", secrets)
    assert data_size(data) == MAX_SECRET_BYTES


@pytest.mark.parametrize("fmt", ["KeyValue", "Dotenv", "Json"])
def test_oversize_is_refused_without_values(fmt: str) -> None:
    chunk = 64 * 1024
    secrets = {f"K{i:02d}": CANARY * (chunk // len(CANARY)) for i in range(17)}
    with pytest.raises(RenderError, match="over the 1 MiB") as err:
        render(fmt, secrets)
    message = str(err.value)
    assert CANARY not in message
    assert "bytes, over the 1 MiB (1048576 bytes) Kubernetes Secret limit" in message


def test_oversize_by_one_byte_reports_the_size() -> None:
    with pytest.raises(RenderError, match=f"is {MAX_SECRET_BYTES + 1} bytes"):
        render("KeyValue", {"A": "x" * MAX_SECRET_BYTES, "B": "y"})


@pytest.mark.parametrize("fmt", ["KeyValue", "Dotenv", "Json"])
@given(secrets=st.dictionaries(data_keys, dotenv_values_text, max_size=6))
def test_data_size_counts_decoded_utf8_bytes(fmt: str, secrets: dict[str, str]) -> None:
    data = render(fmt, secrets)
    assert data_size(data) == sum(len(base64.b64decode(v)) for v in data.values())
    if fmt == "KeyValue":
        assert data_size(data) == sum(len(v.encode()) for v in secrets.values())


def test_data_size_rejects_invalid_base64() -> None:
    with pytest.raises(ValueError):
        data_size({"A": "not base64!"})


# --- data_hash --------------------------------------------------------------------------


def test_data_hash_known_answer() -> None:
    # Pins the encoding: sha256 of '[["A","eA=="],["B",""]]'. Hashes may be recorded on
    # cluster objects, so changing this is a compatibility break.
    assert data_hash({"B": "", "A": "eA=="}) == (
        "5b12d2fdcadba1e5305de67307ce92a9a21de9a49d8ede076e352c44b32cda1d"
    )


def test_data_hash_distinguishes_changes() -> None:
    base = {"A": "eA==", "B": ""}
    assert data_hash(base) != data_hash({"A": "eA==", "B": "eQ=="})
    assert data_hash(base) != data_hash({"A": "eA=="})
    assert data_hash(base) != data_hash({"A": "eA==", "C": ""})
    # No ambiguity between where a key ends and a value begins.
    assert data_hash({"ab": "c"}) != data_hash({"a": "bc"})
    assert data_hash({}) != data_hash({"": ""})


# --- no values in errors ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "secrets", "key"),
    [
        ("KeyValue", {"bad key": CANARY, "GOOD": CANARY}, None),
        ("KeyValue", {"A": CANARY + "\ud800"}, None),
        ("Dotenv", {"bad key": CANARY}, None),
        ("Dotenv", {"A": CANARY + "\0"}, None),
        ("Json", {"A": CANARY + "\udfff"}, None),
        ("Json", {"A": CANARY}, "bad key"),
        ("Json", {f"K{i}": CANARY * 5000 for i in range(20)}, None),
    ],
)
def test_errors_never_contain_values(fmt: str, secrets: dict[str, str], key: str | None) -> None:
    with pytest.raises(RenderError) as err:
        render(fmt, secrets, key=key)
    exc = err.value
    assert CANARY not in str(exc)
    assert CANARY not in repr(exc)
    assert all(CANARY not in str(arg) for arg in exc.args)
    assert all(CANARY not in k for k in exc.keys)
    # Nothing chained that a traceback printer could reveal (UnicodeEncodeError quotes
    # the text it failed on).
    assert exc.__cause__ is None
    assert exc.__context__ is None


@settings(max_examples=50)
@given(st.dictionaries(st.text(max_size=12), st.text(max_size=20), min_size=1, max_size=6))
def test_errors_never_contain_values_property(secrets: dict[str, str]) -> None:
    canaried = {k: f"{CANARY}{v}" for k, v in secrets.items()}
    for fmt in ("KeyValue", "Dotenv", "Json"):
        try:
            render(fmt, canaried)
        except RenderError as exc:
            assert CANARY not in str(exc)
            assert exc.__context__ is None
