"""Real model definitions for import coverage (tests/test_model_import.py, bench/model_coverage.py).

Hugging Face ``transformers`` architectures are built from their configs with random weights (nothing is
downloaded), at their real widths but fewer layers (layers repeat, so the kernels are the same); the rest are
plain-torch networks written here. Each is handed to tunecore the way users do: as an ONNX file written by
``torch.onnx.export`` (its TorchScript exporter, which writes shapes as Shape → Gather → Concat chains, with
a dynamic batch axis as people export), or, where that exporter fails, as a ``file.py:factory`` PyTorch module.

Needs torch and transformers (the ``models`` extra).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

import torch


@dataclasses.dataclass(frozen=True)
class CorpusModel:
    name: str
    build: Callable[[], tuple[Any, tuple]]  # the module (eval mode) and example inputs
    input_names: tuple[str, ...]
    form: str  # "onnx" (exported with torch.onnx.export) or "torch" (--model this_file.py:<name>)
    dynamic: tuple[dict, ...] = ()  # per input, symbolic axes of the ONNX file: {axis: name}
    why_torch: str = ""  # for form "torch": why the ONNX export is not used


class _FirstOutput(torch.nn.Module):
    """A transformers model called the way export needs (tensors only, no cache), returning its first output."""

    def __init__(self, model: Any, **call: Any):
        super().__init__()
        self.model, self.call = model, call

    def forward(self, x: Any) -> Any:
        return self.model(x, return_dict=False, **self.call)[0]


def _hf(model_class: str, config_class: str, inputs: Callable[[], tuple], call: dict | None = None,
        **config: Any) -> Callable[[], tuple[Any, tuple]]:
    def build() -> tuple[Any, tuple]:
        import transformers

        torch.manual_seed(0)
        model = getattr(transformers, model_class)(getattr(transformers, config_class)(**config)).eval()
        return _FirstOutput(model, **(call or {})).eval(), inputs()

    return build


def _tokens(length: int) -> Callable[[], tuple]:
    def make() -> tuple:
        return (torch.randint(0, 1000, (1, length), generator=torch.Generator().manual_seed(0)),)

    return make


def _image(size: int = 224, channels: int = 3) -> Callable[[], tuple]:
    def make() -> tuple:
        return (torch.randn(1, channels, size, size, generator=torch.Generator().manual_seed(0)),)

    return make


def _plain(make_module: Callable[[], Any], inputs: Callable[[], tuple]) -> Callable[[], tuple[Any, tuple]]:
    def build() -> tuple[Any, tuple]:
        torch.manual_seed(0)
        return make_module().eval(), inputs()

    return build


# plain-torch networks -------------------------------------------------------------------------------------


def _resnext() -> Any:
    """ResNeXt-50 (32x4d) bottlenecks, one per stage: grouped 3x3 convs."""
    from torch import nn

    class Bottleneck(nn.Module):
        def __init__(self, cin: int, width: int, cout: int, stride: int):
            super().__init__()
            self.body = nn.Sequential(
                nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                nn.Conv2d(width, width, 3, stride, 1, groups=32, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout))
            self.skip = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x: Any) -> Any:
            return (self.body(x) + self.skip(x)).relu()

    stages = [Bottleneck(64, 128, 256, 1), Bottleneck(256, 256, 512, 2), Bottleneck(512, 512, 1024, 2),
              Bottleneck(1024, 1024, 2048, 2)]
    return nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1),
                         *stages, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000))


def _shufflenet() -> Any:
    """ShuffleNetV2 (1.0x) units: channel split, channel shuffle by view/transpose/view, depthwise convs."""
    from torch import nn

    def shuffle(x: Any, groups: int) -> Any:
        b, c, h, w = x.shape
        return x.view(b, groups, c // groups, h, w).transpose(1, 2).contiguous().view(b, -1, h, w)

    def branch(cin: int, cout: int, stride: int) -> Any:
        return nn.Sequential(
            nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
            nn.Conv2d(cout, cout, 3, stride, 1, groups=cout, bias=False), nn.BatchNorm2d(cout),
            nn.Conv2d(cout, cout, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

    class Unit(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int):
            super().__init__()
            self.stride = stride
            half = cout // 2
            self.left = nn.Sequential(
                nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False), nn.BatchNorm2d(cin),
                nn.Conv2d(cin, half, 1, bias=False), nn.BatchNorm2d(half), nn.ReLU()) if stride > 1 else None
            self.right = branch(cin if stride > 1 else half, half, stride)

        def forward(self, x: Any) -> Any:
            if self.stride == 1:
                keep, work = x.chunk(2, dim=1)
                out = torch.cat((keep, self.right(work)), dim=1)
            else:
                out = torch.cat((self.left(x), self.right(x)), dim=1)
            return shuffle(out, 2)

    layers: list = [nn.Conv2d(3, 24, 3, 2, 1, bias=False), nn.BatchNorm2d(24), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    cin = 24
    for cout, repeats in ((116, 2), (232, 2), (464, 2)):
        layers += [Unit(cin, cout, 2)] + [Unit(cout, cout, 1) for _ in range(repeats - 1)]
        cin = cout
    layers += [nn.Conv2d(cin, 1024, 1, bias=False), nn.BatchNorm2d(1024), nn.ReLU(), nn.AdaptiveAvgPool2d(1)]

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.features, self.head = nn.Sequential(*layers), nn.Linear(1024, 1000)

        def forward(self, x: Any) -> Any:
            x = self.features(x)
            return self.head(x.view(x.size(0), -1))  # flattening by a computed shape, as torchvision writes it

    return Net()


def _mobilenet_v1() -> Any:
    """MobileNetV1: depthwise-separable convolutions (depthwise 3x3 + pointwise 1x1), ReLU6."""
    from torch import nn

    def separable(cin: int, cout: int, stride: int) -> list:
        return [nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False), nn.BatchNorm2d(cin), nn.ReLU6(),
                nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU6()]

    plan = [(32, 64, 1), (64, 128, 2), (128, 128, 1), (128, 256, 2), (256, 256, 1), (256, 512, 2),
            (512, 512, 1), (512, 1024, 2), (1024, 1024, 1)]
    layers = [nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU6()]
    for cin, cout, stride in plan:
        layers += separable(cin, cout, stride)
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(1024, 1000))


def _squeezenet() -> Any:
    """SqueezeNet 1.1 as torchvision builds it: fire modules (1x1 squeeze, then 1x1 and 3x3 expands
    concatenated), ceil-mode max pools, biased convs without batch norm, a 1x1 conv classifier."""
    from torch import nn

    class Fire(nn.Module):
        def __init__(self, cin: int, squeeze: int, expand: int):
            super().__init__()
            self.squeeze = nn.Sequential(nn.Conv2d(cin, squeeze, 1), nn.ReLU())
            self.expand1x1 = nn.Sequential(nn.Conv2d(squeeze, expand, 1), nn.ReLU())
            self.expand3x3 = nn.Sequential(nn.Conv2d(squeeze, expand, 3, padding=1), nn.ReLU())

        def forward(self, x: Any) -> Any:
            x = self.squeeze(x)
            return torch.cat((self.expand1x1(x), self.expand3x3(x)), dim=1)

    def pool() -> Any:
        return nn.MaxPool2d(3, 2, ceil_mode=True)

    return nn.Sequential(
        nn.Conv2d(3, 64, 3, 2), nn.ReLU(), pool(), Fire(64, 16, 64), Fire(128, 16, 64), pool(),
        Fire(128, 32, 128), Fire(256, 32, 128), pool(), Fire(256, 48, 192), Fire(384, 48, 192), Fire(384, 64, 256),
        Fire(512, 64, 256), nn.Conv2d(512, 1000, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())


def _googlenet() -> Any:
    """GoogLeNet (Inception v1) as torchvision builds it, without the auxiliary classifiers: convs without bias
    followed by batch norm (eps 0.001), ceil-mode max pools, and in each Inception module's third branch a 3x3 conv
    where the paper has a 5x5 (torchvision's weights were trained so)."""
    from torch import nn

    def conv(cin: int, cout: int, kernel: int, stride: int = 1) -> Any:
        return nn.Sequential(nn.Conv2d(cin, cout, kernel, stride, kernel // 2, bias=False),
                             nn.BatchNorm2d(cout, eps=0.001), nn.ReLU())

    class Inception(nn.Module):
        def __init__(self, cin: int, c1: int, r3: int, c3: int, r5: int, c5: int, proj: int):
            super().__init__()
            self.branches = nn.ModuleList([
                conv(cin, c1, 1), nn.Sequential(conv(cin, r3, 1), conv(r3, c3, 3)),
                nn.Sequential(conv(cin, r5, 1), conv(r5, c5, 3)),
                nn.Sequential(nn.MaxPool2d(3, 1, 1, ceil_mode=True), conv(cin, proj, 1))])

        def forward(self, x: Any) -> Any:
            return torch.cat([branch(x) for branch in self.branches], dim=1)

    def pool(kernel: int = 3) -> Any:
        return nn.MaxPool2d(kernel, 2, ceil_mode=True)

    return nn.Sequential(
        conv(3, 64, 7, 2), pool(), conv(64, 64, 1), conv(64, 192, 3), pool(),
        Inception(192, 64, 96, 128, 16, 32, 32), Inception(256, 128, 128, 192, 32, 96, 64), pool(),
        Inception(480, 192, 96, 208, 16, 48, 64), Inception(512, 160, 112, 224, 24, 64, 64),
        Inception(512, 128, 128, 256, 24, 64, 64), Inception(512, 112, 144, 288, 32, 64, 64),
        Inception(528, 256, 160, 320, 32, 128, 128), pool(2),
        Inception(832, 256, 160, 320, 32, 128, 128), Inception(832, 384, 192, 384, 48, 128, 128),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(1024, 1000))


CORPUS: tuple[CorpusModel, ...] = (
    CorpusModel("bert", _hf("BertModel", "BertConfig", _tokens(128), num_hidden_layers=2),
                ("input_ids",), "onnx", ({0: "batch", 1: "sequence"},)),
    CorpusModel("distilbert", _hf("DistilBertModel", "DistilBertConfig", _tokens(128), n_layers=2),
                ("input_ids",), "onnx", ({0: "batch", 1: "sequence"},)),
    CorpusModel("gpt2", _hf("GPT2Model", "GPT2Config", _tokens(64), {"use_cache": False}, n_layer=2),
                ("input_ids",), "torch",
                why_torch="torch.onnx.export (TorchScript) has no ONNX form of aten::diff, which transformers' "
                          "causal-mask code calls"),
    CorpusModel("t5-encoder", _hf("T5EncoderModel", "T5Config", _tokens(128), num_layers=2),
                ("input_ids",), "onnx", ({0: "batch", 1: "sequence"},)),
    CorpusModel("vit", _hf("ViTModel", "ViTConfig", _image(), num_hidden_layers=2),
                ("pixel_values",), "onnx", ({0: "batch"},)),
    CorpusModel("swin", _hf("SwinModel", "SwinConfig", _image(), depths=[1, 1, 2, 1]),
                ("pixel_values",), "onnx", ({0: "batch"},)),
    CorpusModel("convnext", _hf("ConvNextModel", "ConvNextConfig", _image(), depths=[1, 1, 2, 1]),
                ("pixel_values",), "onnx", ({0: "batch"},)),
    CorpusModel("resnext", _plain(_resnext, _image()), ("input",), "onnx", ({0: "batch"},)),
    CorpusModel("shufflenet-v2", _plain(_shufflenet, _image()), ("input",), "onnx", ({0: "batch"},)),
    CorpusModel("mobilenet-v1", _plain(_mobilenet_v1, _image()), ("input",), "onnx", ({0: "batch"},)),
    CorpusModel("squeezenet", _plain(_squeezenet, _image()), ("input",), "onnx", ({0: "batch"},)),
    CorpusModel("googlenet", _plain(_googlenet, _image()), ("input",), "onnx", ({0: "batch"},)),
)
BY_NAME = {model.name: model for model in CORPUS}


def factory(name: str) -> tuple[Any, tuple]:
    return BY_NAME[name].build()


def gpt2() -> tuple[Any, tuple]:  # --model tunecore/workloads/corpus.py:gpt2
    return factory("gpt2")


def model_spec(name: str, directory: str) -> tuple[str, list[str]]:
    """The ``--model`` value for a corpus model (writing its ONNX file into ``directory`` once) and the
    ``--input-shape`` values its symbolic non-batch axes need."""
    model = BY_NAME[name]
    if model.form == "torch":
        return f"{os.path.abspath(__file__)}:{name.replace('-', '_')}", []
    path = os.path.join(directory, f"{name}.onnx")
    if os.path.exists(path) and not any(axis > 0 for axes in model.dynamic or () for axis in axes):
        return path, []  # exported, and only its batch axis is symbolic: no shapes to read off the torch inputs
    module, inputs = model.build()
    if not os.path.exists(path):
        export_onnx(module, inputs, model.input_names, model.dynamic, path)
    shapes = [f"{n}={'x'.join(str(d) for d in x.shape)}" for n, x, axes in zip(model.input_names, inputs,
                                                                               model.dynamic or [{}] * len(inputs))
              if any(axis > 0 for axis in axes)]
    return path, shapes


def export_onnx(module: Any, inputs: tuple, names: tuple[str, ...], dynamic: tuple[dict, ...], path: str) -> None:
    import warnings

    # a file of its own per process: two processes exporting the same model at once each rename a whole file
    partial = f"{path}.{os.getpid()}.partial"
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, inputs, partial, dynamo=False, input_names=list(names), output_names=["output"],
                          dynamic_axes={n: axes for n, axes in zip(names, dynamic) if axes}, opset_version=17)
    os.replace(partial, path)
