# Copyright 2026 The treetune-verl Authors
# SPDX-License-Identifier: Apache-2.0
