/**
 * The conservation property suite's driver on the models: a generated case (test/helpers/conservation-cases.ts)
 * run on three regions of the agent's decision path over the reference models, on one manual clock
 * (test/helpers/model-world.ts). Answers what was admitted, for the global checker.
 */
import {
  type Call,
  type Case,
  callBody,
  policyOf,
  type PolicySpec,
  recordAnswer,
  newRecord,
  type RunRecord,
  seeded,
} from './conservation-cases.js';
import { ModelWorld } from './model-world.js';

/** Let background work (top-ups, loans) finish: a few macrotask turns. */
async function settle(): Promise<void> {
  for (let i = 0; i < 3; i++) await new Promise((r) => setImmediate(r));
}

export async function runOnModels(c: Case, seed: number): Promise<RunRecord> {
  const world = new ModelWorld({
    policies: c.policies.map(policyOf),
    borrowing: c.borrowing,
    random: seeded(seed),
  });
  const specs = new Map<string, PolicySpec>(c.policies.map((p) => [p.name, p]));
  const record = newRecord();
  const frozen = new Set<string>();
  const cut = new Set<string>();
  /** The calls, all at once; again `rounds` times, `gapMs` apart. */
  const traffic = async (step: { calls: Call[]; rounds: number; gapMs: number }): Promise<void> => {
    const failing = frozen.size > 0 || cut.size > 0;
    for (let round = 0; round < step.rounds; round++) {
      if (round > 0) {
        await settle();
        world.clock.advance(step.gapMs);
      }
      await Promise.all(
        step.calls.flatMap((call) =>
          call.regions.flatMap((region) =>
            Array.from({ length: call.repeat }, async () => {
              const answer = await world.decide(region, callBody(call));
              recordAnswer(record, specs, call, answer, world.clock.now(), failing, region);
            }),
          ),
        ),
      );
    }
  };
  try {
    for (const step of c.steps) {
      switch (step.op) {
        case 'traffic':
          await traffic(step);
          break;
        // The models hold no lease (their shares are the world's table): a lapse is the integration tier's, and
        // here only its bursts run (the lean's five times, 200 ms apart: the models have no rebalancer to wait for).
        case 'lapse':
          if (step.lean !== undefined) await traffic({ calls: [step.lean], rounds: 5, gapMs: 200 });
          await traffic(step);
          break;
        case 'advance':
          world.clock.advance(step.ms);
          break;
        case 'move': {
          if (step.from === step.to) break;
          const given = world.shrink(step.policy, step.from, step.amount);
          // The taker grows once every decision under the giver's old share is over.
          await settle();
          world.grow(step.policy, step.to, given);
          break;
        }
        case 'reserve': {
          const r = world.region(step.region);
          const call = {
            regions: [step.region],
            checks: [{ policy: step.policy, subject: step.subject, cost: step.amount }],
            dryRun: false,
            repeat: 1,
          };
          const failing = frozen.size > 0 || cut.size > 0;
          let reserved;
          try {
            reserved = await r.reservations.reserve(
              { policy: step.policy, subject: step.subject, amount: step.amount },
              'world',
            );
          } catch (error) {
            if (error instanceof Error && 'code' in error) break; // a 4xx (or the store is frozen)
            throw error;
          }
          const before = record.charges.length;
          recordAnswer(record, specs, call, reserved.outcome, world.clock.now(), failing, step.region);
          const charged = record.charges.slice(before);
          if (reserved.reservation === undefined || step.settle === 'hold') break;
          const id = reserved.reservation.id;
          try {
            const settled =
              step.settle === 'commit'
                ? await r.reservations.commit(id, step.used)
                : await r.reservations.cancel(id);
            // What came back is a negative charge at the settlement (the checker sums admits less refunds).
            if (!settled.replayed && settled.refunded > 0)
              for (const c of charged)
                record.charges.push({
                  ...c,
                  cost: -settled.refunded,
                  at: world.clock.now(),
                  sentAt: world.clock.now(),
                });
          } catch (error) {
            if (!(error instanceof Error && 'code' in error)) throw error;
          }
          break;
        }
        case 'batch': {
          // One batch per region, all regions at once: each element is one of the calls, repeated.
          const failing = frozen.size > 0 || cut.size > 0;
          const regions = [...new Set(step.calls.flatMap((c) => c.regions))];
          await Promise.all(
            regions.map(async (region) => {
              const calls = step.calls
                .filter((c) => c.regions.includes(region))
                .flatMap((c) => Array.from({ length: c.repeat }, () => c));
              const answers = await world.decideBatch(region, { decisions: calls.map(callBody) });
              if ('error' in answers) return;
              answers.forEach((answer, i) =>
                recordAnswer(record, specs, calls[i]!, answer, world.clock.now(), failing, region),
              );
            }),
          );
          break;
        }
        case 'grant': {
          const failing = frozen.size > 0 || cut.size > 0;
          const taken = await world.takeGrant(step.region, {
            policy: step.policy,
            subject: step.subject,
            amount: step.amount,
          });
          if ('error' in taken) break; // a 4xx (a kind or mode without grants) or 503 (a frozen store)
          // The client spends whole tokens of its grant in its own process: admissions the store never saw,
          // paid for by the grant's pre-debit.
          const spent = Math.min(step.spend, Math.floor(taken.granted + 1e-9));
          const call = {
            regions: [step.region],
            checks: [{ policy: step.policy, subject: step.subject, cost: 1 }],
            dryRun: false,
            repeat: 1,
          };
          for (let i = 0; i < spent; i++)
            recordAnswer(
              record,
              specs,
              call,
              { allowed: true, results: [{ allowed: true }] },
              world.clock.now(),
              failing,
              step.region,
            );
          const rest = Math.round((taken.granted - spent) * 1e6) / 1e6;
          if (step.settle !== 'crash' && taken.grant !== null) {
            await settle();
            world.clock.advance(10);
            if (rest > 0)
              await world.returnGrant(step.region, {
                policy: step.policy,
                subject: step.subject,
                grant: taken.grant,
                amount: rest,
              });
            // A cheat hands the whole grant back again under its id once its rest was returned (a double return),
            // then under a forged id: neither may credit anything (a 404, or nothing to credit when the region
            // cannot decide the subject now, or a failure). A holder that spent its grant and returns it as unspent
            // is not a cheat a return can catch: it decides its own admissions anyway.
            if (step.settle === 'cheat') {
              const forged = 'forged'.padEnd(22, '_');
              for (const grant of rest > 0 ? [taken.grant, forged] : [forged]) {
                const again = await world.returnGrant(step.region, {
                  policy: step.policy,
                  subject: step.subject,
                  grant,
                  amount: taken.granted,
                });
                if ('credited' in again && again.credited > 0)
                  throw new Error(`a cheating return was credited: ${JSON.stringify(again)}`);
              }
            }
          }
          break;
        }
        case 'restart':
          world.region(step.region).restart();
          break;
        case 'freeze':
          world.region(step.region).store.frozen = step.on;
          if (step.on) frozen.add(step.region);
          else frozen.delete(step.region);
          break;
        case 'cut':
          world.region(step.region).cut = step.on;
          if (step.on) cut.add(step.region);
          else cut.delete(step.region);
          break;
      }
      await settle();
    }
  } finally {
    world.close();
  }
  return record;
}
