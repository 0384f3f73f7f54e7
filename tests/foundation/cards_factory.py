"""A valid model card to start tests from."""

from fedzoo.cards import InputSpec, Latency, Metrics, ModelCard

SHA = "ab" * 32


def make_card(**overrides) -> ModelCard:
    fields = dict(
        id="mnist-ofa-1",
        family="ofa-mbv2",
        task="mnist",
        input=InputSpec(name="input", shape=["batch", 1, 28, 28]),
        labels=[str(d) for d in range(10)],
        arch={"depths": [1, 2], "kernels": [3, 5]},
        metrics=Metrics(accuracy=0.97, loss=0.1, num_examples=1000),
        macs=1_000_000,
        params=20_000,
        size_bytes=80_000,
        sha256=SHA,
        latency_ms={"cloud-x86-1t": Latency(median_ms=0.4, source="measured", threads=1)},
    )
    fields.update(overrides)
    return ModelCard(**fields)
