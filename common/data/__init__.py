"""Datasets, splits and client partitions, prompts for causal-LM classification."""

from common.data.corpora import DATASETS, Corpus, load_corpus
from common.data.federated import FederatedSplit, SplitSettings, federated_split
from common.data.prompts import PROMPTS, Prompt, prompt_for
from common.data.split import dirichlet_partition, iid_partition, partition, train_test_split

__all__ = [
    "DATASETS",
    "PROMPTS",
    "Corpus",
    "FederatedSplit",
    "Prompt",
    "SplitSettings",
    "dirichlet_partition",
    "federated_split",
    "iid_partition",
    "load_corpus",
    "partition",
    "prompt_for",
    "train_test_split",
]
