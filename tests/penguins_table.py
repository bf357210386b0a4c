"""A penguins-like table made here (issue 34): three species, bill length and depth and flipper length in
mm, body mass in grams (~4,000), the year (~2008), island and sex as text with empty cells; split over three
sites as CSV files with a few labels each, and the consortium's schema file that reads them
(xclp/schema.py). Used by tests/training/test_input_scaling.py and tests/service/test_training_schema_e2e.py."""

import csv
import json

import numpy as np

SPECIES = ["Adelie", "Chinstrap", "Gentoo"]
SITES = ["a", "b", "c"]
# per species: bill length, bill depth, flipper (mm), body mass (g); islands it lives on
MEANS = {"Adelie": (38.8, 18.3, 190.0, 3700.0), "Chinstrap": (48.8, 18.4, 196.0, 3730.0),
         "Gentoo": (47.5, 15.0, 217.0, 5080.0)}
ISLANDS = {"Adelie": ["Biscoe", "Dream", "Torgersen"], "Chinstrap": ["Dream"], "Gentoo": ["Biscoe"]}
HEADER = ["animal", "species", "island", "bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g",
          "sex", "year"]
SCHEMA = {
    "label": {"column": "species", "classes": SPECIES},
    "id": "animal",
    "missing": ["", "NA"],
    "features": [
        {"name": "bill_length_mm", "kind": "numeric", "fill": 44.0},
        {"name": "bill_depth_mm", "kind": "numeric", "fill": 17.0},
        {"name": "flipper_length_mm", "kind": "numeric", "fill": 200.0},
        {"name": "body_mass_g", "kind": "numeric", "fill": 4200.0},
        {"name": "year", "kind": "numeric", "fill": 2008},
        {"name": "island", "kind": "categorical", "categories": ["Biscoe", "Dream", "Torgersen"]},
        {"name": "sex", "kind": "categorical", "categories": ["female", "male", "unknown"], "fill": "unknown"},
    ],
}


def penguins_tables(tmp_path, n_per_site: int = 110, labels_per_class: int = 3, seed: int = 0):
    """Three sites' CSVs (empty cells in numbers and in sex; a few labels each), the schema file, and each
    site's truth."""
    rng = np.random.default_rng(seed)
    (tmp_path / "schema.json").write_text(json.dumps(SCHEMA))
    truths = {}
    for site in SITES:
        rows, truth = [], []
        for i in range(n_per_site):
            sp = SPECIES[int(rng.integers(3))]
            bl, bd, fl, bm = MEANS[sp]
            cells = [f"{bl + rng.normal(0, 2.5):.1f}", f"{bd + rng.normal(0, 1.0):.1f}", f"{fl + rng.normal(0, 6):.0f}",
                     f"{bm + rng.normal(0, 350):.0f}"]
            if rng.random() < 0.05:
                cells[int(rng.integers(4))] = ""  # a missing measurement: the schema's fill
            sex = ["female", "male", ""][int(rng.integers(3)) if rng.random() < 0.15 else int(rng.integers(2))]
            rows.append([f"{site}{i}", sp, ISLANDS[sp][int(rng.integers(len(ISLANDS[sp])))], *cells, sex,
                         str(2007 + int(rng.integers(3)))])
            truth.append(SPECIES.index(sp))
        truth = np.array(truth)
        keep = np.concatenate([np.flatnonzero(truth == c)[:labels_per_class] for c in range(3)])
        for i in range(n_per_site):
            if i not in keep:
                rows[i][1] = ""  # unlabelled: an empty label cell
        with open(tmp_path / f"{site}.csv", "w", newline="") as f:
            csv.writer(f).writerows([HEADER, *rows])
        truths[site] = truth
    return tmp_path / "schema.json", truths
