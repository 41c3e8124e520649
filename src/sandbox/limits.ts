/** Hard bounds on what one request may ask of the sandbox service. */

/** Children one fork request may ask for. */
export const MAX_FORK = 1000;
