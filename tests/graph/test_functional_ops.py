"""Every quantizable op in its functional form goes through quantize_transform_pass by type: the node keeps
its name, the numbers equal the op on quantized operands, and the quantized graph re-traces."""

from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch import nn

import lowbit
from lowbit.graph import QGraph, quantize_transform_pass
from lowbit.graph.qgraph import _trace
from lowbit.nn import OP_ROLES
from lowbit.nn.roles import ROLES

Q = lowbit.get_format("integer")(width=8, frac_width=5)
CONFIG = {"name": "integer", **{f"{role}_{key}": value for role in ("data_in", "weight", "bias", "data_out")
                                for key, value in (("width", 8), ("frac_width", 5))}}  # fmt: skip


class Functional(nn.Module):
    """One functional call per quantizable op."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w = nn.Parameter(torch.randn(6, 6, generator=g) * 0.3)
        self.b = nn.Parameter(torch.randn(6, generator=g) * 0.1)
        self.kernel = nn.Parameter(torch.randn(2, 1, 3, 3, generator=g) * 0.3)
        self.kernel1d = nn.Parameter(torch.randn(2, 1, 3, generator=g) * 0.3)
        self.table = nn.Parameter(torch.randn(10, 6, generator=g))
        self.register_buffer("mean", torch.zeros(2))
        self.register_buffer("var", torch.ones(2))

    def forward(self, x, indices):
        a = F.linear(x, self.w, self.b)  # [4, 6]
        a = operator.add(a, x)
        a = torch.sub(a, 0.25)
        a = operator.mul(a, x)
        a = F.relu(a)
        a = torch.matmul(a, self.w)
        c = torch.bmm(a.view(2, 2, 6), a.view(2, 6, 2))  # [2, 2, 2]
        a = F.gelu(a) + F.embedding(indices, self.table)
        a = F.softmax(a, dim=-1)
        a = F.layer_norm(a, (6,), self.w[0], self.b)
        image = a.view(1, 1, 4, 6)
        image = F.batch_norm(F.conv2d(image, self.kernel, None, 1, 1), self.mean, self.var, self.b[:2], self.b[2:4])
        line = F.conv1d(a.view(1, 1, 24), self.kernel1d)
        return image.sum() + line.sum() + c.sum()


def _reference(m: Functional, x, indices):
    """The same computation with every operand and result quantized by hand, in the node order."""
    q = Q
    unsigned = Q.replace(signed=False)  # a ReLU's integer input is unsigned, as in MASE
    a = q(F.linear(q(x), q(m.w), q(m.b)))
    a = q(q(a) + q(x))
    a = q(q(a) - 0.25)
    a = q(q(a) * q(x))
    a = q(F.relu(unsigned(a)))
    a = q(torch.matmul(q(a), q(m.w)))
    c = q(torch.bmm(q(a.view(2, 2, 6)), q(a.view(2, 6, 2))))
    a = q(q(q(F.gelu(q(a)))) + q(q(F.embedding(indices, q(m.table)))))
    a = q(F.softmax(q(a), dim=-1))
    a = q(F.layer_norm(q(a), (6,), q(m.w[0]), q(m.b)))
    image = q(F.conv2d(q(a.view(1, 1, 4, 6)), q(m.kernel), None, 1, 1))
    image = q(F.batch_norm(q(image), m.mean, m.var, q(m.b[:2]), q(m.b[2:4])))
    line = q(F.conv1d(q(a.view(1, 1, 24)), q(m.kernel1d)))
    return q(q(q(q(image.sum()) + q(line.sum()))) + q(c.sum()))


def _quantized():
    model = Functional()
    graph = QGraph(model)
    args = {"by": "type", "default": {"config": {"name": "NA"}}}
    for op, (required, optional) in OP_ROLES.items():
        config = {"name": "integer"}
        for role in required + optional:  # the forward roles: the reference models no gradient / accumulator
            if role in ROLES:
                config.update({f"{role}_width": 8, f"{role}_frac_width": 5})
        args[op] = {"config": config}
    graph, info = quantize_transform_pass(graph, args)
    return model, graph, info


def test_every_functional_op_is_quantized_and_keeps_its_node_name():
    _, graph, info = _quantized()
    assert [n.name for n in graph.nodes] == [n.name for n in QGraph(Functional()).nodes]
    assert set(info["counts"]) == set(OP_ROLES)
    assert info["counts"]["add"] == 4 and info["counts"]["linear"] == 1
    assert all(n.op != "call_module" for n in graph.nodes)


def test_functional_ops_equal_the_ops_on_quantized_operands():
    model, graph, _ = _quantized()
    torch.manual_seed(3)
    x = torch.randn(4, 6)
    indices = torch.tensor([1, 3, 5, 7])
    with torch.no_grad():
        assert torch.equal(graph.model(x, indices), _reference(model, x, indices))
        assert not torch.equal(graph.model(x, indices), model(x, indices))


def test_quantized_functional_graph_retraces_to_the_same_graph():
    _, graph, _ = _quantized()
    retraced = QGraph(_trace(graph.model, None, ()))
    assert [(n.name, n.op, n.target) for n in retraced.nodes] == [(n.name, n.op, n.target) for n in graph.nodes]
    x, indices = torch.randn(4, 6), torch.tensor([2, 4, 6, 8])
    assert torch.equal(retraced.model(x, indices), graph.model(x, indices))


def test_python_int_arithmetic_sharing_an_op_name_still_works():
    class Sizes(nn.Module):
        def forward(self, x):
            return x.view(x.size(0) * 2, -1) + 1.0

    graph = QGraph(Sizes())
    graph, info = quantize_transform_pass(graph, {"by": "type", "mul": {"config": {"name": "integer", "data_in_width": 8}},
                                                  "add": {"config": {"name": "integer", "data_in_width": 8}}})  # fmt: skip
    assert info["counts"] == {"mul": 1, "add": 1}
    x = torch.randn(4, 6)
    assert torch.equal(graph.model(x), Q.replace(frac_width=4)(Q.replace(frac_width=4)(x).view(8, -1) + 1.0))
