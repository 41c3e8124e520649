/**
 * What audit offers: the JSON-lines audit log, its line's shape and its query. Other folders
 * import this folder through this file alone (test/unit/layering.test.ts).
 */
export { auditLine } from "./audit-line.js";
export { AuditLog } from "./audit-log.js";
export type { AuditRecord } from "./audit-log.js";
export { queryAudit } from "./audit-query.js";
