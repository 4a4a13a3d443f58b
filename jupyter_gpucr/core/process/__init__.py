"""Processes gpucr runs: the namespace holder (PID 1) and its in-namespace parts, the launcher,
process trees and identities, a process's record and what a start hands back."""
