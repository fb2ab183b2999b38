"""The conformance suite: a case grid checked against PyTorch's float64 CPU results, plus gradcheck."""
from .cases import Case, all_cases, ci_subset, curated, gradcheck_cases, grid, select
from .report import Report
from .runner import CaseResult, default_device, gradcheck_case, run, run_case
from .tolerance import TensorCheck, bound, check

__all__ = ["Case", "CaseResult", "Report", "TensorCheck", "all_cases", "bound", "check", "ci_subset", "curated",
           "default_device", "gradcheck_case", "gradcheck_cases", "grid", "run", "run_case", "select"]
