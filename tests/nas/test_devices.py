"""`--device`: names resolve to torch devices or to errors naming the fix; data for a CPU run is not copied."""

import numpy as np
import pytest
import torch

from fedzoo.errors import InvalidInputError
from fedzoo.nas.devices import DeviceData, autocast, describe_device, resolve_device


def test_cpu_and_auto_resolve_to_a_device_torch_has():
    assert resolve_device("cpu") == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    assert describe_device(torch.device("cpu")) == {"device": "cpu"}


@pytest.mark.parametrize("name", ["gpu", "cuda:x", "tpu:0", ""])
def test_a_name_that_is_no_device_is_refused_with_the_choices(name):
    with pytest.raises(InvalidInputError) as error:
        resolve_device(name)
    assert error.value.field == "device" and "cpu" in str(error.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
@pytest.mark.parametrize("name", ["cuda", "cuda:0", "CUDA:1"])
def test_cuda_without_a_gpu_says_to_use_the_cpu(name):
    with pytest.raises(InvalidInputError, match="no CUDA GPU") as error:
        resolve_device(name)
    assert error.value.field == "device"


def test_cpu_data_is_used_in_place_and_batches_follow_the_index():
    x = np.arange(5 * 2 * 3 * 3, dtype=np.float32).reshape(5, 2, 3, 3)
    y = np.arange(5, dtype=np.int64)
    data = DeviceData.place(x, y, torch.device("cpu"))
    assert data.on_device and data.x.data_ptr() == x.ctypes.data  # no copy of the set
    images, labels = data.batch(torch.tensor([4, 1]))
    assert torch.equal(labels, torch.tensor([4, 1])) and torch.equal(images, torch.from_numpy(x[[4, 1]]))


def test_autocast_off_changes_nothing_and_on_computes_in_bfloat16():
    weight = torch.randn(4, 4)
    with autocast(torch.device("cpu"), enabled=False):
        assert (weight @ weight).dtype == torch.float32
    with autocast(torch.device("cpu"), enabled=True):
        assert (weight @ weight).dtype == torch.bfloat16
