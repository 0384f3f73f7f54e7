"""The device side imports and runs without torch; inference and benchmarking without onnx either."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from fedzoo.edge.calibration_models import calibration_model

BLOCKER = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked in this test")
        return None
sys.meta_path.insert(0, Block())
"""


def run_without(blocked: set[str], body: str) -> str:
    script = f"BLOCKED = {sorted(blocked)!r}\n" + BLOCKER + textwrap.dedent(body)
    completed = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    return completed.stdout


def test_inference_and_benchmark_need_neither_torch_nor_onnx(tmp_path) -> None:
    path = tmp_path / "tiny.onnx"
    path.write_bytes(calibration_model("cal-tiny-fp32"))
    output = run_without({"torch", "onnx"}, f"""
        import numpy as np
        import fedzoo.edge
        from fedzoo.edge.runtime import EdgeSession
        from fedzoo.edge.benchmark import benchmark_model
        from fedzoo.edge.device_profile import collect_device_profile
        from fedzoo.edge import fleet, kernels, latency_predictor, calibration_models  # onnx only when used
        session = EdgeSession({str(path)!r})
        logits = session.run(np.zeros((2, 1, 8, 8), np.float32))
        models = {{"cal-tiny-fp32": open({str(path)!r}, "rb").read()}}
        profile = collect_device_profile("d1", calibration_models=models)
        assert "torch" not in sys.modules and "onnx" not in sys.modules
        print(logits.shape, benchmark_model({str(path)!r}, timed_runs=3).runs, len(profile.benchmarks))
    """)
    assert output.split() == ["(2,", "10)", "3", "1"]


def test_prediction_for_a_device_needs_onnx_but_not_torch() -> None:
    output = run_without({"torch"}, """
        from fedzoo.edge.calibration_models import CALIBRATION_MODEL_NAMES, calibration_model
        from fedzoo.edge.latency_predictor import predict_for_device
        benchmarks = [{"model": name, "median_ms": 0.1} for name in CALIBRATION_MODEL_NAMES]
        latency_ms = predict_for_device(calibration_model("cal-mobilenet-fp32"), benchmarks)
        assert "torch" not in sys.modules
        print(latency_ms > 0)
    """)
    assert output.strip() == "True"
