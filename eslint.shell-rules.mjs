// One copy of each rule, in core/: the shells (simulator, agent, coordinator, test harness) import core's rules
// and never write their own. These syntax patterns are what a local copy looks like; eslint.config.mjs applies them
// to the shells and test/unit/repo/sim-runs-core.test.ts proves each one catches a copy. Matched on the syntax tree, so
// a copy split over lines, or with its operands the other way round, is caught too.

/** `a * b` where one operand is named like `names` and the other like `others` (`x`, `o.x`, `o.x!`). */
function product(names, others) {
  const operand = (side, re) =>
    `:matches([${side}.name=${re}], [${side}.property.name=${re}], [${side}.expression.name=${re}], [${side}.expression.property.name=${re}])`;
  return [
    `BinaryExpression[operator='*']${operand('left', names)}${operand('right', others)}`,
    `BinaryExpression[operator='*']${operand('left', others)}${operand('right', names)}`,
  ];
}

/** A comparison whose left side is named like `re` (`x` or `o.x`). */
const comparing = (re) =>
  `BinaryExpression[operator=/^[<>]=?$/]:matches([left.name=${re}], [left.property.name=${re}])`;

/** Each rule: what it copies (and where the one copy lives), and the syntax a copy has. */
export const COPIED_RULES = [
  {
    rule: 'the constrained-subject threshold (core/shares/usage-accounting.ts)',
    selectors: ['VariableDeclarator[id.name="NEAR_CAPACITY_FRACTION"]'],
  },
  {
    rule: 'the share-sum tolerance (core/lease/trust-checks.ts)',
    selectors: ['VariableDeclarator[id.name="SHARE_SUM_TOLERANCE"]'],
  },
  {
    rule: 'share → bucket sizing (core/shares/share-sizing.ts)',
    selectors: product('/^(capacity|refillPerSecond)$/i', '/^share$/i'),
  },
  {
    rule: 'the near-capacity test (core/shares/usage-accounting.ts)',
    selectors: [
      `${comparing('/^remaining/i')} Identifier[name=/capacity$/i]`,
      comparing('/^remainingFraction$/i'),
    ],
  },
  {
    rule: 'usage counting or shares-in-force accounting (core/)',
    selectors: ['ClassDeclaration[id.name=/(UsageMeter|UsageCounter|InForce[A-Za-z0-9_]*Map|ShareSum)$/]'],
  },
  {
    rule: 'the rebalancer (use LeaseCoordinator, or naive-dynamic only: core/rebalance)',
    selectors: ['CallExpression[callee.name="idealShares"]', 'NewExpression[callee.name="DemandTracker"]'],
  },
  {
    rule: "a token bucket's decision (core/models/token-bucket.ts: decideBucket, BucketModel)",
    selectors: ['CallExpression[callee.name=/^(refill|settle)$/]'],
  },
];

/** Files allowed to use a rule's syntax, with the reason. */
export const COPIED_RULE_EXCEPTIONS = [
  {
    // The naive strategy is the rebalancer without the protocol, by design: it calls core's functions.
    files: ['simulations/dynamic/naive-control-plane.ts'],
    rule: COPIED_RULES[5].rule,
  },
  {
    // Rates of admitted and refused cost for the allocation view: display, not the rebalancer's demand.
    files: ['coordinator/protocol/allocation-insight.ts'],
    rule: COPIED_RULES[5].rule,
  },
  {
    // Checks a fixed split's size against maxCost at configuration time, before any bucket exists.
    files: ['simulations/strategies/local-buckets.ts'],
    rule: COPIED_RULES[2].rule,
  },
];

/** The shells the rules apply to. */
export const SHELL_FILES = [
  'simulations/**/*.ts',
  'regional-agent/**/*.ts',
  'coordinator/**/*.ts',
  'common/**/*.ts',
  'test/harness/**/*.ts',
];

/** Selectors for `no-restricted-syntax`, each with its message; without the rules `except` names. */
export function copiedRuleSelectors(except = []) {
  return COPIED_RULES.filter(({ rule }) => !except.includes(rule)).flatMap(({ rule, selectors }) =>
    selectors.map((selector) => ({ selector, message: `copies ${rule}: import it from core/` })),
  );
}

/** `no-restricted-imports` options for simulations/: the simulator runs core/, not the agent or the coordinator. */
export const SIMULATOR_IMPORTS = {
  patterns: [
    {
      group: ['**/regional-agent/**', '!**/regional-agent/config.js', '**/coordinator/**', '**/common/**'],
      message:
        "the simulator runs core/: import the rule from core/ (the agent's defaults: regional-agent/config.js)",
    },
  ],
};
