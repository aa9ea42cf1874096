"""Engines for the extension's tests: the shape of kubeinfer.runtime.engines.base's
Engine and ExecutionSlot, over numpy buffers the tests can look into."""

import numpy as np


class Spec:
    def __init__(
        self, name, datatype, shape, axis_names=(), min_item_shape=None, max_item_shape=None
    ):
        self.name, self.datatype, self.shape = name, datatype, shape
        self.axis_names = axis_names
        self.min_item_shape, self.max_item_shape = min_item_shape, max_item_shape


class Slot:
    """Rows of x (FP32, 3 wide) and s (BYTES); y = 2 x, t = s upper-cased."""

    def __init__(self, engine):
        self.engine = engine
        self.x = np.zeros((4, 3), np.float32)
        self.s = np.empty((4,), object)
        self.runs = []

    def input_views(self, rows, shape=None):
        x = self.x[:rows]
        if self.engine.layout == "strided":
            x = np.zeros((rows, 6), np.float32)[:, ::2]
        if self.engine.layout == "fortran":
            x = np.asfortranarray(np.zeros((rows, 3), np.float32))
        if self.engine.layout == "float64":
            x = np.zeros((rows, 3), np.float64)
        return {"x": x, "s": self.s[:rows]}

    def run(self, rows, shape=None):
        self.runs.append((rows, shape))
        if self.engine.fail:
            raise RuntimeError("the model broke on purpose")
        upper = np.array([b.upper() for b in self.s[:rows]], dtype=object)
        # y transposed twice: a view that is not C-contiguous, which must still copy right.
        y = np.ascontiguousarray((self.x[:rows] * 2).T).T
        return {"y": y, "t": upper}


class Engine:
    inputs = (Spec("x", "FP32", (-1, 3)), Spec("s", "BYTES", (-1,)))
    outputs = (Spec("y", "FP32", (-1, 3)), Spec("t", "BYTES", (-1,)))
    max_batch_size = 4

    def __init__(self, layout="rows", fail=False, platform=None):
        self.layout, self.fail = layout, fail
        self.slots = []
        if platform is not None:
            self.platform = platform

    def create_slot(self):
        self.slots.append(Slot(self))
        return self.slots[-1]


class ShapedSlot:
    """ids (INT64, a variable sequence axis) at the front of a buffer sized for the
    largest batch; out = ids + 1."""

    def __init__(self):
        self.buffer = np.zeros(4 * 8, np.int64)
        self.runs = []

    def input_views(self, rows, shape=None):
        (item,) = shape
        return {"ids": self.buffer[: rows * item[0]].reshape(rows, *item)}

    def run(self, rows, shape=None):
        self.runs.append((rows, shape))
        return {"out": self.input_views(rows, shape)["ids"] + 1}


class ShapedEngine:
    inputs = (Spec("ids", "INT64", (-1, -1), ("sequence",), (1,), (8,)),)
    outputs = (Spec("out", "INT64", (-1, -1), ("sequence",), None, (8,)),)
    max_batch_size = 4

    def __init__(self):
        self.slots = []

    def create_slot(self):
        self.slots.append(ShapedSlot())
        return self.slots[-1]
