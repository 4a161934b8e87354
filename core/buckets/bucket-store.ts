import type { Clock } from '../clock.js';
import { decodeReply, encodeRequest, type DecideRequest, type Decision } from '../wire/bucket.js';
import { BucketModel } from '../models/token-bucket.js';

/** Where buckets live: Redis in the services, the in-memory model in unit tests and the simulator. */
export interface BucketStore {
  /** Decide every check of the request all-or-nothing. Throws only when something broke, never to deny. */
  decide(request: DecideRequest): Promise<Decision>;
}

/** A BucketStore over the reference model and an injected clock. */
export class ModelBucketStore implements BucketStore {
  readonly model = new BucketModel();
  readonly #clock: Clock;

  constructor(clock: Clock) {
    this.#clock = clock;
  }

  decide(request: DecideRequest): Promise<Decision> {
    return Promise.resolve(this.decideNow(request));
  }

  /** Synchronous form, for the simulator. */
  decideNow(request: DecideRequest): Decision {
    const encoded = encodeRequest(request);
    return decodeReply(this.model.evaluate(encoded, Math.round(this.#clock.now() * 1000)));
  }
}
