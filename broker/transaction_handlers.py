"""END_TRANSACTION, CHECK_TRANSACTIONS and LIST_TRANSACTIONS: the gms wire adapter of
:class:`gms.broker.services.transactions.TransactionOutcomeService` (docs/transactions.md)."""

from __future__ import annotations

from collections.abc import Awaitable

from gms.broker.services.transactions import Ended, TransactionOutcomeService, state_name
from gms.protocol.fields import INT32, field
from gms.protocol.frame import Frame, Response


class TransactionHandlers:
    def __init__(self, service: TransactionOutcomeService) -> None:
        self.service = service

    def end_transaction(self, request: Frame) -> Response | Awaitable[Response | None] | None:
        """Answered with how many messages were resolved (``messages``; not their positions: a
        transaction may hold more than a send's answer can list) once stored per ``acks``."""
        fields = request.fields
        ended = self.service.end(field(fields, "tx_id", str), field(fields, "commit", bool),
                                 field(fields, "acks", INT32, 1))
        if isinstance(ended, Ended):
            return self._answer(ended)

        async def answer_when_stored() -> Response:
            return self._answer(await ended)
        return answer_when_stored()

    def _answer(self, ended: Ended) -> Response:
        return Response({"messages": ended.messages, "state": state_name(ended.committed),
                         "broker": self.service.messages.address})

    async def check_transactions(self, request: Frame) -> Response:
        """The due transactions' ids (``transactions``: rows with ``count`` records each) and
        their half messages, back to back in the body."""
        fields = request.fields
        due = await self.service.due_checks(field(fields, "group", str), field(fields, "poll_ms", int, 0))
        rows, body = [], []
        for check in due:
            rows.append({"tx_id": check.tx_id, "checks": check.checks, "count": len(check.halves)})
            body += check.halves
        return Response({"transactions": rows}, body=body)

    async def list_transactions(self, request: Frame) -> Response:
        return Response({"transactions": self.service.state.listing(), "broker": self.service.messages.address})
