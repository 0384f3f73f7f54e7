"""Once-for-all NAS: a search space of MobileNetV2-style classifiers (`space`), standalone subnets
(`subnet.build_subnet`), the weight-sharing supernet (`supernet`), sandwich-rule training (`training`),
candidate scoring (`evaluation`), latency estimates (`latency`), Pareto tools (`pareto`), the
evolutionary and random searches (`search`) and the ONNX export every zoo model ships as (`export`). The
pipeline that runs them is `fedzoo.cloud.pipeline`."""
