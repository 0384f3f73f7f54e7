import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def _one_torch_thread():
    torch.set_num_threads(1)
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def digits():
    """sklearn digits split and its normalised train/test images."""
    from zoo_factory import digits_split

    from fedzoo.cards import Normalisation
    from fedzoo.compress.measure import normalise

    split = digits_split()
    normalisation = Normalisation(mean=split.mean, std=split.std)
    return split, normalise(split.train.x, normalisation), normalise(split.test.x, normalisation)


@pytest.fixture(scope="session")
def trained_mobilenet(digits, tmp_path_factory):
    """A TinyMobileNet trained a few epochs on digits, and its exported ONNX file."""
    from models import TinyMobileNet
    from zoo_factory import train

    from fedzoo.nas.export import export_checked

    torch.set_num_threads(1)
    torch.manual_seed(0)
    split, train_x, test_x = digits
    model = train(TinyMobileNet(width=16), train_x, split.train.y, epochs=4)
    path = tmp_path_factory.mktemp("fp32") / "mobilenet.onnx"
    export_checked(model, (1, 1, 8, 8), path, test_x[:8])
    return model, path
