#!/usr/bin/env node
// The `quotaplane` command: runs cli/main.ts from source through tsx, as every script of this repository does.
import { register } from 'tsx/esm/api';

register();
await import('../cli/main.ts');
