//! NCCL backend (cargo feature `nccl`): work in progress.
