#!/usr/bin/env bash
# Trusted escrow verifier of the zero bed: the farm runs it as
#   /usr/bin/bash <escrow_set>/escrow-verify.sh <approot> <escrow_set> [--restore]
# Builtins only: checks that the set and the bed's baseline are there, then says APG_ESCROW_OK.
if [ "$#" -lt 2 ] || [ "$#" -gt 3 ]; then
  echo "usage: escrow-verify.sh <approot> <escrow_set> [--restore]" >&2
  exit 2
fi
if [ "$#" -eq 3 ] && [ "$3" != "--restore" ]; then
  echo "escrow-verify.sh: unknown option $3" >&2
  exit 2
fi
if [ ! -f "$2/fixtures.txt" ]; then
  echo "APG_ESCROW_NONE incomplete escrow set: $2/fixtures.txt missing" >&2
  exit 1
fi
if [ ! -f "$1/.ai-proving-ground/baseline.json" ]; then
  echo "APG_ESCROW_MISMATCH .ai-proving-ground/baseline.json (no baseline in $1)" >&2
  exit 1
fi
echo "APG_ESCROW_OK $2" >&2
exit 0
