"""Search configs of our own in MASE's layout (and lowbit's extensions) for the search tests."""

TOY_MASE = """
model = "toy"
dataset = "toy_tiny"
task = "cls"
batch_size = 512
seed = 42

[search.search_space]
name = "graph/quantize/mixed_precision_ptq"

[search.search_space.setup]
by = "name"

[search.search_space.seed.default.config]
name = ["integer"]
data_in_width = [4, 8]
data_in_frac_width = [3, 5]
weight_width = [2, 4, 8]
weight_frac_width = [3, 5]
bias_width = [4, 8]
bias_frac_width = [3, 5]

[search.strategy]
name = "optuna"
eval_mode = true

[search.strategy.sw_runner.basic_evaluation]
data_loader = "val_dataloader"
num_samples = 256

[search.strategy.hw_runner.average_bitwidth]
compare_to = 32

[search.strategy.setup]
n_jobs = 1
n_trials = 4
timeout = 20000
sampler = "tpe"
sum_scaled_metrics = false

[search.strategy.metrics]
accuracy.scale = 1.0
accuracy.direction = "maximize"
average_bitwidth.scale = 0.2
average_bitwidth.direction = "minimize"
"""

# MASE's other spelling (resnet18_tpe_search): runner names as strings, loader keys beside them; one scaled
# objective
TOY_MASE_STRINGS = """
model = "toy"
dataset = "toy_tiny"

[search.search_space]
name = "graph/quantize/mixed_precision_ptq"
[search.search_space.setup]
by = "type"
[search.search_space.seed.default.config]
name = ["integer"]
data_in_width = [8]
data_in_frac_width = [4]
weight_width = [2, 8]
weight_frac_width = [4]

[search.strategy]
name = "optuna"
sw_runner = "basic_evaluation"
hw_runner = "average_bitwidth"
data_loader = "val_dataloader"
num_samples = 128
[search.strategy.setup]
n_trials = 3
sampler = "random"
sum_scaled_metrics = true
direction = "maximize"
[search.strategy.metrics]
accuracy.scale = 1.0
accuracy.direction = "maximize"
average_bitwidth.scale = 0.2
average_bitwidth.direction = "minimize"
"""

DIGITS_PRESETS = """
model = "digits_mlp"
dataset = "digits"

[search.search_space]
name = "graph/quantize/mixed_precision_ptq"
[search.search_space.setup]
by = "type"
ops = ["linear"]
[search.search_space.seed.linear]
choices = ["int8", "mxfp4"]

[search.strategy]
name = "optuna"
cost_table = {default = {default = 1.0}}
[search.strategy.sw_runner.basic_evaluation]
num_samples = 100
[search.strategy.setup]
n_trials = 2
sampler = "grid"
[search.strategy.metrics]
accuracy.direction = "maximize"
weight_bits.direction = "minimize"
cost.direction = "minimize"
"""

DIGITS_ROLES = """
model = "digits_mlp"
dataset = "digits"

[search.search_space]
name = "graph/quantize/mixed_precision_ptq"
skip = ["fc3"]
[search.search_space.setup]
by = "regex"
ops = ["linear"]
[search.search_space.seed."fc[12]".roles.weight]
name = ["integer", "mxfp4_e2m1", "block_fp", "e4m3"]
integer = {width = [4, 8], frac_width = [3]}
block_fp = {width = [4, 6], block_size = [[1, 16], [1, 32]]}
[search.search_space.seed."fc[12]".roles.data_in]
name = ["NA", "e4m3"]

[search.strategy]
name = "optuna"
[search.strategy.sw_runner.basic_evaluation]
num_samples = 100
[search.strategy.setup]
n_trials = 5
sampler = "nsga2"
[search.strategy.metrics]
accuracy.direction = "maximize"
weight_bits.direction = "minimize"
"""

DIGITS_SHARED = DIGITS_ROLES.replace('by = "regex"', 'by = "regex"\nshare = true').replace('skip = ["fc3"]', "")
