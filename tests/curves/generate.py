"""Real learning curves for nestor's search-efficiency benchmark.

Real scikit-learn learners on data sets that ship with scikit-learn (or that
its generators make), each configuration evaluated as training grows, with
the compute each point cost. Nothing is downloaded. Four data sets:

- digits-sizes: load_digits (1,797 x 64, 10 classes), seven learner
  families at training sizes growing by sqrt(2) (16 ... 1,257 samples);
  each point is a fit from scratch on the first `size` training samples.
- classification-sizes: make_classification (6,000 x 30, 4 classes, 8% of
  labels flipped), the same families at sizes 16 ... 4,000.
- digits-mlp-epochs: MLPs (SGD or Adam) on load_digits, 60 epochs each.
- hastie-boosting-stages: gradient boosting on make_hastie_10_2 (6,000
  samples), 240 stages each, the curve read off every stage.
- heldout-cancer-sizes: load_breast_cancer (569 x 30), the seven families
  at sizes 16 ... 400; made after the schedulers' defaults were chosen on
  the four above, to check them on curves they were not tuned to.

The metric is the validation error (1 - accuracy) on a held-out set that is
the same for every configuration. The cost columns: `samples_seen`, the
training samples processed so far (a refit on 512 samples after one on 362
has cost 874; an epoch over 1,257 samples costs 1,257; a boosting stage
costs its subsample), and `seconds`, each point's measured fit and predict
time on the machine that made the file (it drives the simulator's clock).

One JSON line per configuration, gzipped, one file per data set:
  {"config": {...}, "metrics": [...], "samples_seen": [...], "seconds": [...]}

Run with scikit-learn 1.9.1 (OMP_NUM_THREADS=1):
  python tests/curves/generate.py tests/curves
The configurations are drawn from a fixed seed; the values depend on the
library versions, the times on the machine.
"""

import gzip
import json
import math
import os
import sys
import time
import warnings
from multiprocessing import Pool

import numpy as np
from sklearn.datasets import load_breast_cancer, load_digits, make_classification, make_hastie_10_2
from sklearn.discriminant_analysis import LinearDiscriminantAnalysis
from sklearn.ensemble import GradientBoostingClassifier, HistGradientBoostingClassifier, RandomForestClassifier
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.neighbors import KNeighborsClassifier
from sklearn.neural_network import MLPClassifier
from sklearn.preprocessing import StandardScaler
from sklearn.svm import SVC
from sklearn.tree import DecisionTreeClassifier

PER_FAMILY = 24


def split(x, y, n_train, seed):
    rng = np.random.RandomState(seed)
    order = rng.permutation(len(y))
    x = StandardScaler().fit(x[order[:n_train]]).transform(x)
    return x[order[:n_train]], y[order[:n_train]], x[order[n_train:]], y[order[n_train:]]


def datasets():
    d = load_digits()
    digits = split(d.data.astype(float), d.target, 1257, 0)
    xc, yc = make_classification(
        n_samples=6000, n_features=30, n_informative=12, n_redundant=6, n_classes=4, n_clusters_per_class=3,
        flip_y=0.08, class_sep=0.9, random_state=1)
    classification = split(xc, yc, 4000, 1)
    xh, yh = make_hastie_10_2(n_samples=6000, random_state=2)
    hastie = split(xh, yh, 4000, 2)
    b = load_breast_cancer()
    cancer = split(b.data.astype(float), b.target, 400, 3)
    return {"digits": digits, "classification": classification, "hastie": hastie, "cancer": cancer}


def loguniform(rng, lo, hi):
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def sample_configs(rng, n_features):
    """Configurations of seven learner families, PER_FAMILY of each."""
    out = []
    for _ in range(PER_FAMILY):
        out.append({"learner": "logreg", "C": loguniform(rng, 1e-4, 1e3)})
        out.append({"learner": "svc", "C": loguniform(rng, 1e-2, 1e3), "gamma": loguniform(rng, 1e-3, 3.0) / n_features})
        out.append({"learner": "knn", "n_neighbors": int(rng.randint(1, 64)), "weights": str(rng.choice(["uniform", "distance"]))})
        out.append({"learner": "tree", "max_depth": int(rng.randint(2, 30)), "min_samples_leaf": int(rng.randint(1, 32))})
        out.append({"learner": "forest", "n_estimators": int(rng.randint(10, 120)), "max_features": round(float(rng.uniform(0.05, 1.0)), 3),
                    "min_samples_leaf": int(rng.randint(1, 16))})
        out.append({"learner": "hgb", "learning_rate": loguniform(rng, 0.01, 1.0), "max_iter": int(rng.randint(20, 200)),
                    "max_leaf_nodes": int(rng.randint(4, 64)), "l2_regularization": loguniform(rng, 1e-4, 10.0)})
        out.append({"learner": "mlp", "hidden": int(rng.randint(8, 160)), "alpha": loguniform(rng, 1e-6, 1.0),
                    "learning_rate_init": loguniform(rng, 1e-4, 3e-2)})
    out.append({"learner": "lda"})
    return unique(out)


def unique(configs):
    """Each configuration once (small discrete spaces repeat), the first kept."""
    seen, out = set(), []
    for c in configs:
        key = json.dumps(c, sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def make(config):
    c = dict(config)
    kind = c.pop("learner")
    if kind == "logreg":
        return LogisticRegression(C=c["C"], max_iter=300)
    if kind == "svc":
        return SVC(C=c["C"], gamma=c["gamma"])
    if kind == "knn":
        return KNeighborsClassifier(n_neighbors=c["n_neighbors"], weights=c["weights"])
    if kind == "tree":
        return DecisionTreeClassifier(max_depth=c["max_depth"], min_samples_leaf=c["min_samples_leaf"], random_state=0)
    if kind == "forest":
        return RandomForestClassifier(n_estimators=c["n_estimators"], max_features=c["max_features"],
                                      min_samples_leaf=c["min_samples_leaf"], random_state=0, n_jobs=1)
    if kind == "hgb":
        return HistGradientBoostingClassifier(learning_rate=c["learning_rate"], max_iter=c["max_iter"], max_leaf_nodes=c["max_leaf_nodes"],
                                              l2_regularization=c["l2_regularization"], early_stopping=False, random_state=0)
    if kind == "mlp":
        return MLPClassifier(hidden_layer_sizes=(c["hidden"],), alpha=c["alpha"], learning_rate_init=c["learning_rate_init"],
                             max_iter=100, random_state=0)
    if kind == "lda":
        return LinearDiscriminantAnalysis()
    raise ValueError(kind)


def sizes(n_train):
    out, k = [], 0
    while True:
        s = int(round(16 * 2 ** (k / 2)))
        if s >= n_train:
            break
        out.append(s)
        k += 1
    return out + [n_train]


def size_curve(job):
    """A configuration refitted from scratch at each training size."""
    data, config = job
    xt, yt, xv, yv = data
    majority = 1.0 - np.mean(yv == np.bincount(yt).argmax())
    metrics, seen, seconds, total = [], [], [], 0
    for s in sizes(len(yt)):
        started = time.perf_counter()
        try:
            if len(np.unique(yt[:s])) < 2:
                raise ValueError("one class")
            err = 1.0 - float(np.mean(make(config).fit(xt[:s], yt[:s]).predict(xv) == yv))
        except ValueError:
            err = majority
        seconds.append(round(time.perf_counter() - started, 5))
        total += s
        metrics.append(round(err, 5))
        seen.append(total)
    return {"config": config, "metrics": metrics, "samples_seen": seen, "seconds": seconds}


def mlp_epochs(job):
    """An MLP trained epoch by epoch with partial_fit."""
    data, config = job
    xt, yt, xv, yv = data
    net = MLPClassifier(hidden_layer_sizes=(config["hidden"],) * config["layers"], alpha=config["alpha"], solver=config["solver"],
                        learning_rate_init=config["learning_rate_init"], batch_size=config["batch_size"], momentum=0.9,
                        random_state=0)
    classes = np.unique(yt)
    metrics, seen, seconds = [], [], []
    for epoch in range(1, 61):
        started = time.perf_counter()
        net.partial_fit(xt, yt, classes=classes)
        err = 1.0 - float(np.mean(net.predict(xv) == yv))
        seconds.append(round(time.perf_counter() - started, 5))
        metrics.append(round(err, 5))
        seen.append(epoch * len(yt))
    return {"config": config, "metrics": metrics, "samples_seen": seen, "seconds": seconds}


def boosting_stages(job):
    """Gradient boosting, its validation error after every stage."""
    data, config = job
    xt, yt, xv, yv = data
    started = time.perf_counter()
    gb = GradientBoostingClassifier(n_estimators=240, learning_rate=config["learning_rate"], max_depth=config["max_depth"],
                                    subsample=config["subsample"], max_features=config["max_features"], random_state=0).fit(xt, yt)
    per_stage = (time.perf_counter() - started) / 240
    metrics = [round(1.0 - float(np.mean(p == yv)), 5) for p in gb.staged_predict(xv)]
    per = int(round(len(yt) * config["subsample"]))
    return {"config": config, "metrics": metrics, "samples_seen": [per * (i + 1) for i in range(240)],
            "seconds": [round(per_stage, 5)] * 240}


def mlp_configs(rng, n):
    return [{"layers": int(rng.randint(1, 3)), "hidden": int(rng.randint(16, 256)), "alpha": loguniform(rng, 1e-6, 1e-1),
             "solver": str(rng.choice(["sgd", "adam"])), "learning_rate_init": loguniform(rng, 1e-4, 3e-1),
             "batch_size": int(rng.choice([16, 32, 64, 128, 256]))} for _ in range(n)]


def boosting_configs(rng, n):
    return [{"learning_rate": loguniform(rng, 0.005, 1.0), "max_depth": int(rng.randint(1, 6)),
             "subsample": round(float(rng.uniform(0.3, 1.0)), 3), "max_features": round(float(rng.uniform(0.2, 1.0)), 3)}
            for _ in range(n)]


def main():
    warnings.filterwarnings("ignore", category=ConvergenceWarning)
    warnings.filterwarnings("ignore", category=UserWarning)
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(__file__)
    data = datasets()
    rng = np.random.RandomState(31)
    plans = [
        ("digits-sizes", size_curve, [(data["digits"], c) for c in sample_configs(rng, 64)]),
        ("classification-sizes", size_curve, [(data["classification"], c) for c in sample_configs(rng, 30)]),
        ("digits-mlp-epochs", mlp_epochs, [(data["digits"], c) for c in mlp_configs(rng, 120)]),
        ("hastie-boosting-stages", boosting_stages, [(data["hastie"], c) for c in boosting_configs(rng, 120)]),
        # Held out: made after the schedulers' defaults were chosen, not in the benchmark.
        ("heldout-cancer-sizes", size_curve, [(data["cancer"], c) for c in sample_configs(rng, 30)]),
    ]
    only = set(sys.argv[2:])
    with Pool(int(os.environ.get("PROCESSES", os.cpu_count() or 1))) as pool:
        for name, fn, jobs in plans:
            if only and name not in only:
                continue
            started = time.perf_counter()
            lines = pool.map(fn, jobs, chunksize=1)
            text = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines)
            with open(os.path.join(out_dir, f"{name}.jsonl.gz"), "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", mtime=0) as z:
                z.write(text.encode())
            best = min(line["metrics"][-1] for line in lines)
            print(f"{name}: {len(lines)} curves, best final {best:.4f}, {time.perf_counter() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
