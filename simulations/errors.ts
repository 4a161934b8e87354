/** A run that cannot start as configured (bad flag, setting or combination): the CLI prints it and exits 2. */
export class SimConfigError extends Error {
  readonly code = 'SIM_ERR_CONFIG';
  constructor(message: string) {
    super(message);
    this.name = 'SimConfigError';
  }
}
