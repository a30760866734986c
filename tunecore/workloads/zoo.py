"""Model zoo: standard networks built in code with relax.frontend.nn.

Weights are left as function parameters (unbound, unspecified values): tuning only needs shapes.
"""

import tvm
from tvm import relax
from tvm.relax.frontend import nn

ZOO_NAMES: tuple[str, ...] = (
    "resnet-18", "resnet-50", "mobilenet-v2", "bert-base", "bert-tiny", "dcgan", "resnet3d-18",
)


# relax.frontend.nn has no pooling or conv-transpose modules, so these wrap relax.op.nn.


class _ConvTranspose2D(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel: int, stride: int, padding: int):
        self.weight = nn.Parameter((in_channels, out_channels, kernel, kernel))  # IOHW, as torch
        self.stride, self.padding = stride, padding

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        out = relax.op.nn.conv2d_transpose(x._expr, self.weight._expr, strides=self.stride,
                                           padding=self.padding)
        return nn.wrap_nested(out, "conv2d_transpose")


class _Linear(nn.Module):
    # Weights stay runtime parameters, so nn.Linear's (out, in) layout would cost a transpose kernel
    # (and a tuning task) on every call; storing (in, out) leaves a plain matmul + bias.
    def __init__(self, in_features: int, out_features: int):
        self.weight = nn.Parameter((in_features, out_features))
        self.bias = nn.Parameter((out_features,))

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return nn.op.matmul(x, self.weight) + self.bias


def _max_pool(x: nn.Tensor, size: int, stride: int, padding: int) -> nn.Tensor:
    rank = len(x.shape) - 2
    pool = relax.op.nn.max_pool2d if rank == 2 else relax.op.nn.max_pool3d
    return nn.wrap_nested(pool(x._expr, (size,) * rank, (stride,) * rank, (padding,) * rank),
                          "max_pool")


def _global_avg_pool_flat(x: nn.Tensor) -> nn.Tensor:
    rank = len(x.shape) - 2
    pool = relax.op.nn.adaptive_avg_pool2d if rank == 2 else relax.op.nn.adaptive_avg_pool3d
    out = nn.wrap_nested(pool(x._expr, (1,) * rank), "avg_pool")
    return nn.op.reshape(out, (x.shape[0], x.shape[1]))


def _conv(rank: int, cin: int, cout: int, kernel, stride=1, padding=0, groups: int = 1):
    conv = nn.Conv2D if rank == 2 else nn.Conv3D
    return conv(cin, cout, kernel, stride=stride, padding=padding, groups=groups, bias=False)


# Inference batch-norm is folded into the preceding conv (scaled weights + per-channel bias), as any
# deployment flow does once weights are known. Kept as a batch_norm op on unbound weights, it would
# recompute sqrt(var + eps) and a divide per output element inside every tuned conv kernel.
class _ConvBN(nn.Module):
    def __init__(self, rank, cin, cout, kernel, stride=1, padding=0, groups=1, act=None):
        self.conv = _conv(rank, cin, cout, kernel, stride, padding, groups)
        self.bias = nn.Parameter((cout,) + (1,) * rank)
        self.act = act

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        x = self.conv(x) + self.bias
        return self.act(x) if self.act is not None else x


# ResNet family (torchvision layout: stride on the 3x3 conv of the bottleneck, "v1.5"); rank 2 is
# ImageNet ResNet, rank 3 is torchvision's r3d_18 video model.


class _BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, rank, cin, width, stride):
        self.conv1 = _ConvBN(rank, cin, width, 3, stride, 1, act=nn.op.relu)
        self.conv2 = _ConvBN(rank, width, width, 3, 1, 1)
        self.downsample = (_ConvBN(rank, cin, width, 1, stride)
                           if stride != 1 or cin != width else None)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        identity = self.downsample(x) if self.downsample is not None else x
        return nn.op.relu(self.conv2(self.conv1(x)) + identity)


class _Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, rank, cin, width, stride):
        cout = width * 4
        self.conv1 = _ConvBN(rank, cin, width, 1, act=nn.op.relu)
        self.conv2 = _ConvBN(rank, width, width, 3, stride, 1, act=nn.op.relu)
        self.conv3 = _ConvBN(rank, width, cout, 1)
        self.downsample = (_ConvBN(rank, cin, cout, 1, stride)
                           if stride != 1 or cin != cout else None)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        identity = self.downsample(x) if self.downsample is not None else x
        return nn.op.relu(self.conv3(self.conv2(self.conv1(x))) + identity)


class _ResNet(nn.Module):
    def __init__(self, block, layers, rank=2, num_classes=1000):
        if rank == 2:
            self.stem = _ConvBN(2, 3, 64, 7, 2, 3, act=nn.op.relu)
        else:  # r3d_18 stem: no temporal stride, no max-pool
            self.stem = _ConvBN(3, 3, 64, [3, 7, 7], [1, 2, 2], [1, 3, 3], act=nn.op.relu)
        self.rank = rank
        blocks, cin = [], 64
        for i, n in enumerate(layers):
            width = 64 * 2**i
            for j in range(n):
                blocks.append(block(rank, cin, width, 2 if i > 0 and j == 0 else 1))
                cin = width * block.expansion
        self.blocks = nn.ModuleList(blocks)
        self.fc = _Linear(cin, num_classes)

    def forward(self, data: nn.Tensor) -> nn.Tensor:
        x = self.stem(data)
        if self.rank == 2:
            x = _max_pool(x, 3, 2, 1)
        for blk in self.blocks:
            x = blk(x)
        return self.fc(_global_avg_pool_flat(x))


class _InvertedResidual(nn.Module):
    def __init__(self, cin, cout, stride, expand):
        hidden = cin * expand
        layers = [] if expand == 1 else [_ConvBN(2, cin, hidden, 1, act=nn.op.relu6)]
        layers += [_ConvBN(2, hidden, hidden, 3, stride, 1, groups=hidden, act=nn.op.relu6),
                   _ConvBN(2, hidden, cout, 1)]
        self.layers = nn.ModuleList(layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        out = x
        for layer in self.layers:
            out = layer(out)
        return out + x if self.residual else out


class _MobileNetV2(nn.Module):
    # (expand ratio, channels, repeats, first stride), torchvision's width-1.0 config
    _CFG = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
            (6, 160, 3, 2), (6, 320, 1, 1))

    def __init__(self, num_classes=1000):
        layers, cin = [_ConvBN(2, 3, 32, 3, 2, 1, act=nn.op.relu6)], 32
        for t, c, n, s in self._CFG:
            for i in range(n):
                layers.append(_InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers.append(_ConvBN(2, cin, 1280, 1, act=nn.op.relu6))
        self.features = nn.ModuleList(layers)
        self.classifier = _Linear(1280, num_classes)

    def forward(self, data: nn.Tensor) -> nn.Tensor:
        x = data
        for layer in self.features:
            x = layer(x)
        return self.classifier(_global_avg_pool_flat(x))


# BERT (HuggingFace BertModel layout, post-LN, erf GELU). The only data input is input_ids: token
# types are all 0 and the attention mask is all ones, which is what a single unpadded sequence
# feeds, and it keeps every integer input a vocabulary index.


class _BertLayer(nn.Module):
    def __init__(self, hidden, heads, ffn):
        self.heads = heads
        self.query = _Linear(hidden, hidden)
        self.key = _Linear(hidden, hidden)
        self.value = _Linear(hidden, hidden)
        self.attn_out = _Linear(hidden, hidden)
        self.attn_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.intermediate = _Linear(hidden, ffn)
        self.output = _Linear(ffn, hidden)
        self.out_norm = nn.LayerNorm(hidden, eps=1e-12)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        b, s, h = x.shape
        d = h // self.heads

        def split_heads(t):  # (b, s, h) -> (b, heads, s, d)
            return nn.op.permute_dims(nn.op.reshape(t, (b, s, self.heads, d)), (0, 2, 1, 3))

        q, k, v = split_heads(self.query(x)), split_heads(self.key(x)), split_heads(self.value(x))
        scores = nn.op.matmul(q, nn.op.permute_dims(k, (0, 1, 3, 2))) * (1.0 / d**0.5)
        ctx = nn.op.matmul(nn.op.softmax(scores, axis=-1), v)
        ctx = nn.op.reshape(nn.op.permute_dims(ctx, (0, 2, 1, 3)), (b, s, h))
        x = self.attn_norm(self.attn_out(ctx) + x)
        return self.out_norm(self.output(nn.op.gelu(self.intermediate(x))) + x)


class _Bert(nn.Module):
    def __init__(self, layers, hidden, heads, ffn, vocab=30522, max_pos=512):
        self.word_embeddings = nn.Embedding(vocab, hidden)
        self.position_embeddings = nn.Embedding(max_pos, hidden)
        self.token_type_embeddings = nn.Embedding(2, hidden)
        self.emb_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.layers = nn.ModuleList([_BertLayer(hidden, heads, ffn) for _ in range(layers)])

    def forward(self, input_ids: nn.Tensor) -> nn.Tensor:
        seq = input_ids.shape[1]
        # Position ids are 0..seq-1, so a slice replaces the gather (and fuses into the add).
        pos = nn.op.split(self.position_embeddings.weight, [seq], axis=0)[0]
        token_type = nn.op.split(self.token_type_embeddings.weight, 2, axis=0)[0]
        x = self.emb_norm(self.word_embeddings(input_ids) + pos + token_type)
        for layer in self.layers:
            x = layer(x)
        return x


class _DCGANGenerator(nn.Module):
    """DCGAN paper / PyTorch example generator: nz=100, ngf=64, 64x64x3 output."""

    def __init__(self, nz=100, ngf=64):
        chans = [nz, ngf * 8, ngf * 4, ngf * 2, ngf]
        self.convs = nn.ModuleList(
            [_ConvTranspose2D(chans[i], chans[i + 1], 4, 1 if i == 0 else 2, 0 if i == 0 else 1)
             for i in range(4)])
        self.biases = nn.ParameterList([nn.Parameter((c, 1, 1)) for c in chans[1:]])  # folded BN
        self.out = _ConvTranspose2D(ngf, 3, 4, 2, 1)

    def forward(self, z: nn.Tensor) -> nn.Tensor:
        x = z
        for conv, bias in zip(self.convs, self.biases):
            x = nn.op.relu(conv(x) + bias)
        return nn.op.tanh(self.out(x))


_SPECS = {
    "resnet-18": (lambda: _ResNet(_BasicBlock, (2, 2, 2, 2)), {"data": ((1, 3, 224, 224), "float32")}),
    "resnet-50": (lambda: _ResNet(_Bottleneck, (3, 4, 6, 3)), {"data": ((1, 3, 224, 224), "float32")}),
    "mobilenet-v2": (_MobileNetV2, {"data": ((1, 3, 224, 224), "float32")}),
    "bert-base": (lambda: _Bert(12, 768, 12, 3072), {"input_ids": ((1, 128), "int32")}),
    "bert-tiny": (lambda: _Bert(2, 128, 2, 512), {"input_ids": ((1, 128), "int32")}),
    "dcgan": (_DCGANGenerator, {"z": ((1, 100, 1, 1), "float32")}),
    "resnet3d-18": (lambda: _ResNet(_BasicBlock, (2, 2, 2, 2), rank=3, num_classes=400),
                    {"data": ((1, 3, 16, 112, 112), "float32")}),
}


def build_zoo_model(name: str) -> tvm.IRModule:
    """Relax IRModule whose "main" takes the data input(s), then every weight (attr "num_input")."""
    if name not in _SPECS:
        raise KeyError(f"unknown zoo model {name!r}; known: {', '.join(ZOO_NAMES)}")
    make, inputs = _SPECS[name]
    # export_tvm matches spec entries to forward()'s argument names
    spec = {"forward": {k: nn.spec.Tensor(shape, dtype) for k, (shape, dtype) in inputs.items()}}
    mod, _ = make().export_tvm(spec)
    main = mod["forward"].with_attr("global_symbol", "main")
    return tvm.IRModule({"main": main})
