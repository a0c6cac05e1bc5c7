"""Image preprocessing: unit behaviour on synthetic files, and the bench README's FP32 top-1 on real images."""

import sys

import numpy as np
import onnxruntime
import pytest

from ppqlike.core.errors import CalibrationDataError, PPQLikeError
from ppqlike.io.images import load_image, load_image_folder
from shared_bench import MODEL_NAMES, PRESETS, label_of, load_images, requires_bench

Image = pytest.importorskip("PIL.Image")


def _save(path, array):
    Image.fromarray(array).save(path)
    return path


def test_resize_shorter_side_then_centre_crop(tmp_path):
    # A 40x80 (h x w) image whose columns encode their x position.
    columns = np.tile(np.arange(80, dtype=np.uint8) * 3, (40, 1))
    path = _save(tmp_path / "wide.png", np.stack([columns] * 3, axis=-1))
    full = load_image(path, resize_shorter=20, crop=None)
    assert full.shape == (1, 3, 20, 40) and full.dtype == np.float32
    cropped = load_image(path, resize_shorter=20, crop=10)
    assert cropped.shape == (1, 3, 10, 10)
    np.testing.assert_array_equal(cropped[0], full[0, :, 5:15, 15:25])  # centred
    rect = load_image(path, resize_shorter=None, crop=(20, 30))
    assert rect.shape == (1, 3, 20, 30)
    np.testing.assert_array_equal(rect[0, 0, 0], columns[0, 25:55].astype(np.float32))


def test_normalisation_channel_order_and_layout(tmp_path):
    pixels = np.zeros((8, 8, 3), np.uint8)
    pixels[..., 0], pixels[..., 1], pixels[..., 2] = 10, 20, 30  # R, G, B
    path = _save(tmp_path / "flat.png", pixels)
    rgb = load_image(path, resize_shorter=None, crop=None)
    assert rgb[0, :, 0, 0].tolist() == [10, 20, 30]
    bgr = load_image(path, resize_shorter=None, crop=None, bgr=True, mean=(1, 2, 3))
    assert bgr[0, :, 0, 0].tolist() == [29, 18, 7]
    scaled = load_image(path, resize_shorter=None, crop=None, scale=2.0, mean=1.0, std=2.0)  # (x / 2 - 1) / 2
    np.testing.assert_allclose(scaled[0, :, 0, 0], [2.0, 4.5, 7.0])
    nhwc = load_image(path, resize_shorter=None, crop=None, layout="NHWC")
    assert nhwc.shape == (1, 8, 8, 3) and nhwc[0, 0, 0].tolist() == [10, 20, 30]


def test_greyscale_and_rgba_become_rgb(tmp_path):
    grey = _save(tmp_path / "grey.png", np.full((6, 6), 77, np.uint8))
    assert load_image(grey, resize_shorter=None, crop=None)[0, :, 0, 0].tolist() == [77, 77, 77]
    rgba = np.zeros((6, 6, 4), np.uint8)
    rgba[..., :3], rgba[..., 3] = 50, 255
    path = _save(tmp_path / "rgba.png", rgba)
    assert load_image(path, resize_shorter=None, crop=None).shape == (1, 3, 6, 6)


def test_folder_sorted_with_limit_and_errors(tmp_path):
    for index, name in enumerate(["b.png", "a.JPG", "c.jpeg"]):
        Image.fromarray(np.full((4, 4, 3), index * 10, np.uint8)).save(tmp_path / name, format="PNG" if name.endswith(".png") else "JPEG")
    (tmp_path / "notes.txt").write_text("not an image")
    images, names = load_image_folder(tmp_path, resize_shorter=None, crop=None)
    assert names == ["a.JPG", "b.png", "c.jpeg"] and images.shape == (3, 3, 4, 4)
    assert load_image_folder(tmp_path, limit=2, resize_shorter=None, crop=None)[1] == ["a.JPG", "b.png"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CalibrationDataError, match="no image files"):
        load_image_folder(empty)
    with pytest.raises(CalibrationDataError, match="does not exist"):
        load_image_folder(tmp_path / "missing")


def test_bad_files_and_options(tmp_path):
    fake = tmp_path / "fake.jpg"
    fake.write_bytes(b"this is not a jpeg")
    with pytest.raises(PPQLikeError, match="fake.jpg"):
        load_image(fake)
    with pytest.raises(PPQLikeError, match="missing.jpg"):
        load_image(tmp_path / "missing.jpg")
    small = _save(tmp_path / "small.png", np.zeros((10, 10, 3), np.uint8))
    with pytest.raises(PPQLikeError, match="smaller than"):
        load_image(small, resize_shorter=None, crop=20)
    with pytest.raises(PPQLikeError, match="layout"):
        load_image(small, layout="CHW")
    with pytest.raises(PPQLikeError, match="mean"):
        load_image(small, mean=(1, 2))


def test_missing_pillow_gives_install_hint(tmp_path, monkeypatch):
    path = _save(tmp_path / "x.png", np.zeros((4, 4, 3), np.uint8))
    monkeypatch.setitem(sys.modules, "PIL", None)  # makes `from PIL import Image` raise ImportError
    with pytest.raises(PPQLikeError, match=r"pip install Pillow.*\.\[images\]"):
        load_image(path)
    from ppqlike.io.calibration_data import CalibrationFolder
    with pytest.raises(PPQLikeError, match="needs Pillow"):  # when the folder is opened, before any pass runs
        CalibrationFolder(tmp_path, {"x": ("N", 3, 4, 4)}, batch_size=1)


@requires_bench
def test_labels_from_file_names():
    assert label_of("n01440764_tench.JPEG") == 0
    assert label_of("/some/folder/n15075141_toilet_tissue.JPEG") == 999


@pytest.mark.real_model
@pytest.mark.slow
@requires_bench
@pytest.mark.parametrize("model", MODEL_NAMES)
def test_fp32_reference_top1_on_dev_images(model):
    """The README's FP32 top-1 on the 300 dev images, within one image: proves the preprocessing."""
    preset = PRESETS[model]
    images, labels, _ = load_images(model, "dev")
    assert images.shape == (300, 3, 224, 224)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 2
    session = onnxruntime.InferenceSession(str(preset.path), options, providers=["CPUExecutionProvider"])
    logits = np.concatenate([session.run(None, {preset.input_name: images[i:i + 50]})[0]
                             for i in range(0, len(images), 50)])
    correct = int((logits.argmax(axis=1) == labels).sum())
    expected = round(preset.reference_top1["dev"] * len(images))  # the README rounds to 3 decimals
    print(f"{model}: {correct}/300 = {correct / 300:.4f} (reference {preset.reference_top1['dev']})")
    assert abs(correct - expected) <= 1, f"{model}: {correct} correct, reference {expected}: preprocessing is off"
