"""Calibrate the cost models to a cluster from its own training runs: read the logs (:mod:`.logs`), fit the constants
(:mod:`.fit`), write and read the profile (:mod:`.profile`), and plan the one-node run that measures them
(:mod:`.run`). No torch or megatron import (reading a ConfigContainer YAML is the command's job, through emit)."""

from .fit import calibrate
from .logs import CalibrationError, RunLog, parse_log, read_log
from .profile import CalibrationProfile, read_profile, write_profile
from .run import calibration_run_plan

__all__ = ["CalibrationError", "CalibrationProfile", "RunLog", "calibrate", "calibration_run_plan", "parse_log",
           "read_log", "read_profile", "write_profile"]
