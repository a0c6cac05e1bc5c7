"""The peers' section of docs/BENCHMARKS.md (issue 33), from a bench/run.py measurement with peer rows:

    CONFIGS='ppqlike:ORT_INT8:default,ppqlike:TRT_INT8:default,ppqlike:TPU_INT8:default'
    CONFIGS+=',ort:MinMax:per_channel,nncf:*,modelopt:*,quark:*'
    python bench/run.py --tools ppqlike,ort,peers --configs "$CONFIGS" --workdir /tmp/peers_work \
        --out /tmp/peers.md --json /tmp/peers.json
    python bench/peers_report.py /tmp/peers.json --workdir /tmp/peers_work   # the section of docs/BENCHMARKS.md

(``--workdir``, the run's, also describes ppqlike's and onnxruntime's models: what each quantizes).

The section goes among the kept sections (after report.KEPT_MARKER, which bench/run.py keeps when it rewrites
the file) and replaces an earlier one of the same title.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers  # noqa: E402
import recipe_report  # noqa: E402
import report  # noqa: E402

TITLE = "## Peer quantizers: NNCF, ModelOpt, Quark (issue 33)"


def _summary(row: dict, model: str, key: str, workdir: Path | None) -> dict | None:
    """What the row's model quantizes: read again from ``workdir`` (bench/run.py --workdir) where the file is
    there, else what the peer's child read (None for ppqlike and onnxruntime rows without a workdir)."""
    path = workdir / f"{model}__{key.replace(':', '_')}.onnx" if workdir else None
    if path is not None and path.exists():
        return peers.qdq_summary(path)
    return (row.get("quantization") or {}).get("child") if key.split(":")[0] in peers.PEER_TOOLS else None


def _detail_rows(models: list[dict], workdir: Path | None) -> list[str]:
    """What each row's model quantizes and what it cost: one line per (model, row)."""
    lines = ["| model | row | activations (count of QuantizeLinear) | weights | Conv/MatMul/Gemm left in float "
             "| logits quantized | top-1 | quant. s | CPU s | peak MiB | speed ×FP32 |",
             "|---|---|---|---|---|---|--:|--:|--:|--:|--:|"]
    for model in models:
        for label, key in recipe_report._rows():
            row = model["rows"].get(key)
            if row is None:
                continue
            if "unavailable" in row or "accuracy" not in row:
                why = row.get("unavailable") or str(report._get(row, "quantization", "error", default="?"))
                lines.append(f"| {model['title']} | {label} | {'unavailable' if 'unavailable' in row else 'failed'}: "
                             f"{why[:200]} | | | | | | |")
                continue
            summary, q = _summary(row, model["model"], key, workdir), row["quantization"]
            if summary is None:
                continue
            weights = ", ".join(f"{n} {k}" for k, n in summary["weight_quantizers"].items())
            floating = summary["float_compute_ops"]
            output = {True: "yes", False: "no"}.get(summary.get("output_quantized"), "?")
            lines.append(f"| {model['title']} | {label} | {summary['activation']} | {weights} "
                         f"| {len(floating)} of {summary['compute_ops']}"
                         + (f" ({', '.join(floating[:3])}{', ...' if len(floating) > 3 else ''})" if floating else "")
                         + f" | {output} | {row['accuracy']['top1']:.3f} | {q['wall_seconds']:.1f} "
                         f"| {q['cpu_seconds']:.1f} | {q['peak_rss_mb']:.0f} | {row['throughput']['speedup']:.2f} |")
    return lines


def section(results: dict, workdir: Path | None = None) -> str:
    env, options = results["environment"], results["options"]
    lines = [TITLE, "",
             f"`{results['command']}` ({options['calib_images']} calibration images, {options['dev_images']} dev "
             f"images; {env['cores']} cores, load {env['load_start']} at the start, {env.get('load_end', '?')} at "
             f"the end; {results.get('seconds', 0) / 60:.0f} min; ppqlike {env['versions'].get('ppqlike')}), then "
             "`python bench/peers_report.py` on its JSON. Every peer runs with its documented defaults in its own "
             "venv (`bench/peers_venv.sh`, bench/README.md) on the same calibration images, writes a QDQ model, and "
             "that model is evaluated in onnxruntime like the other rows.", "",
             *(f"- {note}" for note in results.get("notes", ())), "",
             "Each cell: top-1 agreement with FP32 / SNR / mean output cosine / wall time of the quantizing "
             "process (imports, decoding the calibration JPEGs, calibration, writing the model) / its peak RSS.", "",
             "| row | " + " | ".join(m["title"] for m in results["models"]) + " |",
             "|---|" + "--:|" * len(results["models"])]
    for label, key in recipe_report._rows():
        if any(key in m["rows"] for m in results["models"]):
            lines.append(f"| {label} | " + " | ".join(recipe_report._cell(m, key) for m in results["models"]) + " |")
    lines += ["", *recipe_report.peer_comparison(results["models"]),
              "What each row's model quantizes (read from the written QDQ files by `bench/peers.py: qdq_summary`; "
              "a Conv/MatMul/Gemm is *left in float* where its input or weight does not come out of a "
              "DequantizeLinear, through Identity/Reshape/Pad/MaxPool/Dropout/Concat; *logits quantized*: the model's "
              "output, or the input of its final Softmax, comes out of a DequantizeLinear, so the logits are 8-bit). CPU s: user + system seconds of "
              "the quantizing process, less sensitive to the machine's load than its wall time.", "",
              *_detail_rows(results["models"], workdir), ""]
    return "\n".join(lines) + "\n"


def write_section(text: str, path: Path) -> None:
    """Put ``text`` (a section starting with TITLE) among the kept sections of ``path``, replacing an older one."""
    existing = path.read_text()
    if report.KEPT_MARKER not in existing:
        existing = existing.rstrip("\n") + "\n\n" + report.KEPT_MARKER + "\n"
    head, kept = existing.split(report.KEPT_MARKER, 1)
    if TITLE in kept:
        before, after = kept.split(TITLE, 1)
        following = after.find("\n## ")
        kept = before.rstrip("\n") + "\n\n" + (after[following + 1:] if following >= 0 else "")
    kept = "\n\n" + text + "\n" + kept.lstrip("\n")
    path.write_text(head + report.KEPT_MARKER + kept)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", help="the --json of a bench/run.py run with peer rows")
    parser.add_argument("--out", default=str(report.REPO / "docs" / "BENCHMARKS.md"))
    parser.add_argument("--workdir", default=None, help="the run's --workdir: read every row's model again there "
                                                        "(ppqlike's and onnxruntime's too)")
    args = parser.parse_args()
    workdir = Path(args.workdir) if args.workdir else None
    write_section(section(json.loads(Path(args.results).read_text()), workdir), Path(args.out))


if __name__ == "__main__":
    main()
