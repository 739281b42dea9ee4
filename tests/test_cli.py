"""The laquant command line: results, JSON output, and one-line errors with a non-zero exit."""

import json
import subprocess
import sys

import pytest

from laquant.cli import main
from laquant.errors import LaquantError


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_eval_ppl_table_and_json(capsys, tmp_path, tiny_model_dir):
    path = tmp_path / "out" / "ppl.json"
    code, out, err = _run(capsys, "eval", "ppl", str(tiny_model_dir), "--context", "64", "128",
                          "--max-tokens", "400", "--json", str(path), "--quiet")
    assert code == 0
    assert "prefill" in out and "decode" in out
    payload = json.loads(path.read_text())
    assert payload["tokens"] == 400 and payload["dtype"] == "float32"
    assert [(r["mode"], r["context"]) for r in payload["results"]] == [
        ("prefill", 64), ("decode", 64), ("prefill", 128), ("decode", 128)]
    by_ctx = {}
    for r in payload["results"]:
        by_ctx.setdefault(r["context"], []).append(r["ppl"])
    for pre, dec in by_ctx.values():
        assert pre == pytest.approx(dec, rel=1e-4)


@pytest.mark.parametrize("argv,message", [
    (["eval", "ppl", "/no/such/model"], "model directory not found"),
    (["eval", "ppl", "{tiny}", "--data", "/no/such/file.txt"], "data file not found"),
    (["eval", "ppl", "{tiny}", "--data", "{tmp}"], "is a directory"),
    (["eval", "ppl", "{tiny}", "--data", "{binary}"], "cannot read data file"),
    (["eval", "ppl", "{tiny}", "--data", "{empty}"], "is empty"),
    (["eval", "ppl", "{tiny}", "--context", "4096", "--max-tokens", "300"], "longer than the data"),
    (["eval", "ppl", "{llama}"], "model_type 'llama' is not supported; supported: gla"),
    (["eval", "ppl", "{tiny}", "--device", "cuda:7"] if not __import__("torch").cuda.is_available() else
     ["eval", "ppl", "/no/such/model"],
     "no CUDA device is available" if not __import__("torch").cuda.is_available() else "not found"),
    (["eval", "speed", "--out", "{tmp}/speed"] if not __import__("torch").cuda.is_available() else
     ["eval", "ppl", "/no/such/model"], "needs a CUDA device" if not __import__("torch").cuda.is_available() else
     "not found"),
])
def test_bad_input_is_one_clear_line(capsys, tmp_path, tiny_model_dir, argv, message):
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00\x81" * 10)
    (tmp_path / "empty.txt").write_text("  \n")
    subs = {"{tiny}": str(tiny_model_dir), "{tmp}": str(tmp_path), "{llama}": str(tmp_path / "llama"),
            "{binary}": str(tmp_path / "bin.txt"), "{empty}": str(tmp_path / "empty.txt")}
    code, out, err = _run(capsys, *[subs.get(a, a) for a in argv])
    assert code != 0
    assert message in err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_console_script_runs():
    proc = subprocess.run([sys.executable, "-m", "laquant.cli", "eval", "ppl", "/no/such/dir"],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "laquant: error: model directory not found: /no/such/dir"


def test_checkout_root_does_not_shadow_huggingface_kernels():
    """From the repo root, `kernels/` is importable as top-level `kernels` (Hugging Face's package name, a
    dependency of transformers since 5.25, whose modeling code imports names from it): imported so, it must hand over
    to Hugging Face's package where one is installed, and never drag laquant in."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    code = ("import sys, transformers; from transformers.utils.import_utils import is_kernels_available; "
            "ok = is_kernels_available(); import transformers.modeling_utils; import laquant, kernels; "
            "assert not hasattr(kernels, 'chunk_gla'), 'top-level kernels exposes laquant'; "
            "assert laquant.kernels.chunk_gla; print('ok', kernels.__file__)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-2000:]
    installed = importlib.util.find_spec("kernels")  # from here (the tests' folder): Hugging Face's, if any
    if installed is not None and installed.origin and Path(installed.origin).parent != root / "kernels":
        assert proc.stdout.split()[-1] == installed.origin  # the checkout handed the import over


def test_hub_ids_resolve_through_the_hub_cache(monkeypatch, tiny_model_dir, capsys):
    """`org/name` goes through huggingface_hub (here a local stand-in: nothing is downloaded in tests)."""
    import huggingface_hub

    calls = []
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo, **kw: calls.append(repo) or str(tiny_model_dir))
    assert main(["eval", "ppl", "someorg/tiny-gla", "--max-tokens", "200", "--context", "64", "--quiet"]) == 0
    assert calls and calls[0] == "someorg/tiny-gla"

    def offline(repo, **kw):
        raise OSError("no network")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    assert main(["eval", "ppl", "someorg/missing"]) == 2
    assert "could not be fetched from the Hugging Face Hub (OSError)" in capsys.readouterr().err


def test_datasets_ids_load_the_test_split(monkeypatch, tiny_model_dir):
    """`--data NAME:CONFIG` goes through `datasets.load_dataset` (a local stand-in module here)."""
    import types

    from laquant.data import load_text

    seen = {}

    class Split(dict):
        column_names = ["text"]

    def load_dataset(name, config, split):
        seen.update(name=name, config=config, split=split)
        return Split(text=["first line", "second line"])

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    assert load_text("wikitext:wikitext-2-raw-v1") == "first line\n\nsecond line"
    assert seen == {"name": "wikitext", "config": "wikitext-2-raw-v1", "split": "test"}
    monkeypatch.setitem(sys.modules, "datasets", None)  # not installed
    with pytest.raises(LaquantError, match=r"pip install 'laquant\[datasets\]'"):
        load_text("wikitext:wikitext-2-raw-v1")


def test_speed_report_and_plot_cover_every_suite(tmp_path):
    """The CLI offers every suite the benchmark runs; the report and plot take the delta-rule rows."""
    from laquant.cli import SPEED_SUITES
    from laquant.eval.speed import SUITES, markdown, plot

    assert SPEED_SUITES == list(SUITES)
    result = {"versions": {"device": "test"}, "copy_bandwidth_GBps": 3000.0,
              "delta_decode": [{"B": b, "laquant_fp8_row_us": 4.0 * b, "fla_fp32_us": 9.0 * b} for b in (1, 64)],
              "delta_prefill": [{"T": t, "laquant_ms": 1.0, "fla_ms": 2.0, "speedup_vs_fla": 2.0} for t in (1024, 4096)]}
    md = markdown(result)
    assert "## delta_decode" in md and "## delta_prefill" in md and "| 4096 | 1 | 2 | 2 |" in md
    plot(result, tmp_path / "speed.png")
    assert (tmp_path / "speed.png").read_bytes()[:4] == b"\x89PNG"


def test_eval_ppl_drift_plot(capsys, tmp_path, tiny_model_dir):
    drift = tmp_path / "drift.png"
    code, _, _ = _run(capsys, "eval", "ppl", str(tiny_model_dir), "--baseline", str(tiny_model_dir), "--context", "64",
                      "--mode", "decode", "--max-tokens", "200", "--plot-drift", str(drift), "--quiet")
    assert code == 0 and drift.stat().st_size > 1000
    code, _, err = _run(capsys, "eval", "ppl", str(tiny_model_dir), "--plot-drift", str(drift), "--quiet")
    assert code == 2 and "--baseline" in err


@pytest.mark.parametrize("argv", [
    ["--help"], ["calibrate", "--help"], ["eval", "ppl", "--help"],
    ["calibrate", "--recipe", "no_such_recipe"],
    ["calibrate", "--recipe", "gla_int8", "--set", "state.format=fp9"],
    ["calibrate", "--recipe", "gla_int8", "--set", "nodot"],
    ["calibrate", "--recipe", "gla_int8", "--model", "/no/such/model"],
    ["calibrate", "--recipe", "gla_int8", "--out", "{existing}"],
    ["calibrate", "--recipe", "gla_int8", "--samples", "0"],
    ["eval", "ppl", "/no/such/model"],
    ["generate", "/no/such/model", "--prompt", "hi"],
    ["inspect", "/no/such/model"],
])
def test_help_and_argument_errors_import_neither_torch_nor_transformers(tmp_path, argv):
    """The console entry point checks arguments, recipes and paths before its heavy imports, so it
    answers at once (the timing-free form of "well under a second": what got imported)."""
    (tmp_path / "existing").mkdir()
    (tmp_path / "existing" / "f").write_text("x")
    argv = [a.replace("{existing}", str(tmp_path / "existing")) for a in argv]
    code = ("import sys\nfrom laquant.cli import main\ntry:\n    rc = main(sys.argv[1:])\nexcept SystemExit as e:\n"
            "    rc = e.code\nheavy = sorted(m for m in ('torch', 'transformers', 'numpy', 'safetensors') if m in sys.modules)\n"
            "print('HEAVY', heavy, 'RC', rc, file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True)
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("HEAVY [] RC "), proc.stderr[-2000:]
    if "--help" not in argv:
        assert last != "HEAVY [] RC 0" and proc.stderr.count("laquant: error:") + proc.stderr.count("error:") >= 1
        assert "Traceback" not in proc.stderr


def test_importing_laquant_then_transformers_registers_gla():
    """`import laquant` stays light, and still registers model_type "gla" and the "laquant"
    quantization method once transformers is imported (before or after laquant)."""
    check = ("from transformers import AutoConfig, AutoModelForCausalLM\n"
             "from transformers.quantizers.auto import AUTO_QUANTIZER_MAPPING\n"
             "assert type(AutoConfig.for_model('gla')).__name__ == 'GLAConfig'\n"
             "assert 'laquant' in AUTO_QUANTIZER_MAPPING\n")
    for first, then in (("import sys, laquant\nassert 'transformers' not in sys.modules and 'torch' not in sys.modules\n",
                         check), ("import transformers, laquant\n", check)):
        proc = subprocess.run([sys.executable, "-c", first + then], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-2000:]
