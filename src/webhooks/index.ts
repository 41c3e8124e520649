/**
 * What webhooks offers: lifecycle webhooks (definitions, signed delivery with retries, their
 * settings) and the signature's check. Other folders import this folder through this file alone
 * (test/unit/layering.test.ts).
 */
export { DEFAULT_RETRY, retryDelayMs, retryHorizonMs } from "./backoff.js";
export type { RetryPolicy } from "./backoff.js";
export { WEBHOOK_ID_RE } from "./definitions.js";
export { LIFECYCLE_EVENTS } from "./lifecycle.js";
export type { LifecycleType } from "./lifecycle.js";
export { WebhookService, parseWebhookUrl } from "./service.js";
export type { CreateWebhook, WebhookInfo, WebhookState, WebhookStats } from "./service.js";
export { DEFAULT_WEBHOOK_SETTINGS, webhookSettings } from "./settings.js";
export type { WebhookSettings } from "./settings.js";
export { e2bSignature, signPayload, verifySignature } from "./signature.js";
