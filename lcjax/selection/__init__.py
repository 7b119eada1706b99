"""AutoSelect demonstration selection (the ICML 2026 AutoSelect paper): Plackett–Luce utilities
(:mod:`lcjax.selection.plackett_luce`) and the policy, KL-regularised target, LM reward,
baselines and hidden-rule ICL task (:mod:`lcjax.selection.autoselect`). See docs/autoselect.md.
"""

from lcjax.selection.autoselect import (
    Episode,
    SelectionPolicy,
    answer_log_likelihood,
    best_of_k_selection,
    check_beta,
    demonstration_reward,
    kl_target_weights,
    make_lookup_episode,
    make_offset_episode,
    nearest_neighbour_selection,
    policy_cross_entropy,
    policy_log_prob,
    policy_select,
    random_selection,
)
from lcjax.selection.plackett_luce import (
    MAX_ENUMERATION,
    check_selection,
    gumbel_top_k,
    ordered_subsets,
    pl_expectation,
    pl_log_prob,
)

__all__ = [
    "Episode", "SelectionPolicy", "answer_log_likelihood", "best_of_k_selection", "check_beta",
    "demonstration_reward", "kl_target_weights", "make_lookup_episode", "make_offset_episode",
    "nearest_neighbour_selection", "policy_cross_entropy", "policy_log_prob", "policy_select",
    "random_selection", "MAX_ENUMERATION", "check_selection", "gumbel_top_k", "ordered_subsets",
    "pl_expectation", "pl_log_prob",
]
