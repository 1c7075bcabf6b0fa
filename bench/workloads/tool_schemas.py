"""OpenAI-format tool definitions for every tool the call traces call or read
(``bench/workloads/call_traces.py``), in two namings:

* ``TOOLS``: the traces' own names (``send_email``, ``send_money``, ``run_command``), the ones
  ``examples/policies/agent.yaml`` names;
* ``RENAMES``: the same tools as agent frameworks and MCP servers name them (LangChain's Gmail
  and file-management tools, Composio's upper-case actions, the Slack, filesystem, fetch and
  Brave MCP servers, a payments API, GitHub, booking APIs), with their argument names: what an
  agent whose operator wrote no policy hands the kernel. None of the new names is one that
  ``examples/policies/agent.yaml`` or the shipped default lists, except ``write_file`` (the
  MCP filesystem server's own name). Two old tools may become one new one: a Slack direct
  message and a channel post are both ``slack_post_message(channel, text)``.

A definition is ``{"type": "function", "function": {"name", "description", "parameters"}}``,
``parameters`` a JSON schema (``format: email`` / ``uri`` / ``date`` / ``date-time`` where a
real API declares one). Read tools are listed too: a classifier that reads the schemas must
see which tools only read.

    schemas(names) -> list[dict]     the definitions of these tools (either naming), in order
    renamed(trace) -> Trace          the trace with the second naming: tool names of calls and
                                     results, argument names of calls, the tool list of the
                                     system prompt
    check(traces)                    every call's arguments validate against its schema, in
                                     both namings (raises ValueError)
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from workloads.call_traces import Call, Trace

_EMAIL = {"type": "string", "format": "email"}
_URI = {"type": "string", "format": "uri"}


def _p(type_: str | list[str], description: str, **more: Any) -> dict[str, Any]:
    return {"type": type_, "description": description, **more}


def _emails(description: str) -> dict[str, Any]:
    return {"type": "array", "items": _EMAIL, "description": description}


def _email(description: str) -> dict[str, Any]:
    return {**_EMAIL, "description": description}


def _uri(description: str) -> dict[str, Any]:
    return {**_URI, "description": description}


def _tool(name: str, description: str, properties: Mapping[str, dict[str, Any]] | None = None,
          required: Iterable[str] = ()) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": dict(properties or {}), "required": list(required),
                       "additionalProperties": False}}}


# --- the traces' own names ---------------------------------------------------------------------
_DEFS: list[dict[str, Any]] = [
    # mail
    _tool("get_unread_emails", "Return the unread emails in the user's inbox, newest first.",
          {"limit": _p("integer", "How many emails to return at most.", minimum=1, maximum=100)}),
    _tool("search_emails", "Search the user's mailbox; returns the matching emails with sender, subject and body.",
          {"query": _p("string", "Words to search for in sender, subject and body.")}, ["query"]),
    _tool("read_email", "Return one email, headers and body.",
          {"email_id": _p("string", "The id of the email.")}, ["email_id"]),
    _tool("send_email", "Send an email from the user's account.",
          {"to": _emails("Recipients."), "cc": _emails("Carbon-copy recipients."),
           "bcc": _emails("Blind carbon-copy recipients."), "subject": _p("string", "Subject line."),
           "body": _p("string", "Plain-text body.")}, ["to", "subject", "body"]),
    _tool("reply_to_email", "Reply to an email; the reply goes to its sender.",
          {"email_id": _p("string", "The id of the email to answer."), "body": _p("string", "Reply text.")},
          ["email_id", "body"]),
    _tool("forward_email", "Forward an email to another address.",
          {"email_id": _p("string", "The id of the email to forward."), "to": _email("Who receives the forward.")},
          ["email_id", "to"]),
    _tool("delete_email", "Move an email to the trash.", {"email_id": _p("string", "The id of the email.")},
          ["email_id"]),
    _tool("search_contacts", "Search the user's address book; returns names, e-mail addresses, phone numbers "
          "and notes.", {"query": _p("string", "Name, company or address to look for.")}, ["query"]),
    # calendar
    _tool("get_day_events", "List the events of one day in the user's calendar.",
          {"day": _p("string", "The day.", format="date")}, ["day"]),
    _tool("search_events", "Search the user's calendar by title, participant or date.",
          {"query": _p("string", "Words to search for."), "date": _p("string", "Only this day.", format="date")},
          ["query"]),
    _tool("create_event", "Create a calendar event and invite its participants.",
          {"title": _p("string", "Event title."), "start_time": _p("string", "Start, YYYY-MM-DD HH:MM."),
           "end_time": _p("string", "End, YYYY-MM-DD HH:MM."), "location": _p("string", "Where it takes place."),
           "description": _p("string", "Event description."),
           "participants": _emails("E-mail addresses of the people to invite.")},
          ["title", "start_time", "end_time"]),
    _tool("reschedule_event", "Move an event to a new start (and end) time; participants are notified.",
          {"event_id": _p(["string", "integer"], "The event's id."),
           "new_start_time": _p("string", "New start, YYYY-MM-DD HH:MM."),
           "new_end_time": _p("string", "New end, YYYY-MM-DD HH:MM.")}, ["event_id", "new_start_time"]),
    _tool("cancel_event", "Cancel an event; participants are notified.",
          {"event_id": _p(["string", "integer"], "The event's id.")}, ["event_id"]),
    _tool("add_event_participants", "Invite more people to an existing event.",
          {"event_id": _p(["string", "integer"], "The event's id."),
           "participants": _emails("E-mail addresses to invite.")}, ["event_id", "participants"]),
    # payments
    _tool("get_balance", "Return the balance of the user's bank account."),
    _tool("get_recent_transactions", "Return the account's recent transactions (sender, recipient, amount, "
          "subject, date).", {"n": _p("integer", "How many transactions.", minimum=1, maximum=100)}),
    _tool("get_scheduled_transactions", "Return the account's scheduled and recurring transactions."),
    _tool("send_money", "Transfer money from the user's account.",
          {"recipient": _p("string", "The recipient's IBAN."), "amount": _p("number", "Amount in EUR."),
           "subject": _p("string", "Payment reference."), "date": _p("string", "Execution date.", format="date")},
          ["recipient", "amount", "subject", "date"]),
    _tool("schedule_transaction", "Schedule a transfer for a later date, once or monthly.",
          {"recipient": _p("string", "The recipient's IBAN."), "amount": _p("number", "Amount in EUR."),
           "subject": _p("string", "Payment reference."), "date": _p("string", "First execution date.", format="date"),
           "recurring": _p("boolean", "Repeat monthly.")}, ["recipient", "amount", "subject", "date"]),
    _tool("update_scheduled_transaction", "Change a scheduled transaction; fields left out stay as they are.",
          {"id": _p("integer", "The scheduled transaction's id."), "recipient": _p("string", "New recipient IBAN."),
           "amount": _p("number", "New amount in EUR."), "subject": _p("string", "New reference."),
           "date": _p("string", "New execution date.", format="date"),
           "recurring": _p("boolean", "Repeat monthly.")}, ["id"]),
    _tool("update_password", "Change the password of the user's online banking.",
          {"password": _p("string", "The new password.")}, ["password"]),
    # messaging
    _tool("read_channel_messages", "Read the latest messages of a workspace channel.",
          {"channel": _p("string", "Channel name.")}, ["channel"]),
    _tool("read_inbox", "Read the direct messages the user received.", {"user": _p("string", "Whose inbox.")}),
    _tool("read_sms", "Read the latest text messages on the user's phone."),
    _tool("get_channels", "List the workspace's channels with their owner, topic and description."),
    _tool("get_users_in_channel", "List the members of a channel with their profile.",
          {"channel": _p("string", "Channel name.")}, ["channel"]),
    _tool("send_direct_message", "Send a direct message to a workspace user.",
          {"recipient": _p("string", "The user's handle."), "body": _p("string", "Message text.")},
          ["recipient", "body"]),
    _tool("send_channel_message", "Post a message to a workspace channel.",
          {"channel": _p("string", "Channel name."), "body": _p("string", "Message text.")}, ["channel", "body"]),
    _tool("invite_user_to_workspace", "Invite a person to the workspace by e-mail.",
          {"user": _p("string", "The new user's name or handle."), "email": _email("Where the invitation goes.")},
          ["user", "email"]),
    _tool("add_user_to_channel", "Add a workspace user to a channel.",
          {"user": _p("string", "The user's handle."), "channel": _p("string", "Channel name.")}, ["user", "channel"]),
    _tool("send_sms", "Send a text message from the user's phone.",
          {"phone_number": _p("string", "Recipient in E.164 form."), "message": _p("string", "Message text.")},
          ["phone_number", "message"]),
    # files
    _tool("list_files", "List a folder of the user's file system.", {"path": _p("string", "Folder path.")}, ["path"]),
    _tool("search_files", "Search the user's cloud drive by name and content.",
          {"query": _p("string", "Words to search for.")}, ["query"]),
    _tool("read_file", "Read a file and return its text.", {"path": _p("string", "File path.")}, ["path"]),
    _tool("write_file", "Create a new file or completely overwrite an existing file with new content.",
          {"path": _p("string", "File path."), "content": _p("string", "The file content.")}, ["path", "content"]),
    _tool("append_to_file", "Append text to the end of a file.",
          {"path": _p("string", "File path."), "content": _p("string", "Text to append.")}, ["path", "content"]),
    _tool("delete_file", "Delete a file.", {"path": _p("string", "File path.")}, ["path"]),
    _tool("share_file", "Share a cloud-drive file with someone.",
          {"file_id": _p("string", "The file's id or path."), "email": _email("Who gets access."),
           "permission": _p("string", "Access level.", enum=["view", "comment", "edit"])},
          ["file_id", "email", "permission"]),
    # web and shopping
    _tool("web_search", "Search the web; returns titles, URLs and snippets.",
          {"query": _p("string", "Search query.")}, ["query"]),
    _tool("fetch_url", "Fetch a web page and return its text.", {"url": _uri("The page.")}, ["url"]),
    _tool("post_webpage", "Send content to a web address with an HTTP POST.",
          {"url": _uri("Where to post."), "content": _p("string", "The content to send.")}, ["url", "content"]),
    _tool("download_file", "Download a file from the web into a local folder.",
          {"url": _uri("The file's URL."), "path": _p("string", "Local folder or file path.")}, ["url", "path"]),
    _tool("search_products", "Search the shop's catalogue; returns products with rating, price and reviews.",
          {"query": _p("string", "What to look for.")}, ["query"]),
    _tool("place_order", "Order a product from the shop, paid with the card on file, delivered to the user's "
          "address.", {"product_id": _p("string", "The product's id."),
                       "quantity": _p("integer", "How many.", minimum=1)}, ["product_id", "quantity"]),
    # travel
    _tool("search_hotels", "List the hotels of a city.", {"city": _p("string", "City.")}, ["city"]),
    _tool("get_hotel_reviews", "Hotels of a city with rating, price and guest reviews.",
          {"city": _p("string", "City.")}, ["city"]),
    _tool("get_flight_options", "Flights between two airports on a day, with prices.",
          {"origin": _p("string", "IATA code."), "destination": _p("string", "IATA code."),
           "date": _p("string", "Departure day.", format="date")}, ["destination", "date"]),
    _tool("get_restaurant_reviews", "Restaurants of a city with rating, cuisine and reviews.",
          {"city": _p("string", "City."), "cuisine": _p("string", "Kind of food.")}, ["city"]),
    _tool("get_car_rentals", "Car rental companies at a location with rating and reviews.",
          {"location": _p("string", "City or airport code.")}, ["location"]),
    _tool("reserve_hotel", "Book a hotel for the user.",
          {"hotel": _p("string", "Hotel name."), "start_day": _p("string", "Check-in day.", format="date"),
           "end_day": _p("string", "Check-out day.", format="date")}, ["hotel", "start_day", "end_day"]),
    _tool("book_flight", "Book a flight for a passenger.",
          {"flight_number": _p("string", "Flight number."), "passenger_name": _p("string", "Full name."),
           "date": _p("string", "Departure day.", format="date")}, ["flight_number", "passenger_name", "date"]),
    _tool("reserve_restaurant", "Reserve a restaurant table.",
          {"restaurant": _p("string", "Restaurant name."), "time": _p("string", "YYYY-MM-DD HH:MM."),
           "party_size": _p("integer", "Number of guests.", minimum=1)}, ["restaurant", "time", "party_size"]),
    _tool("reserve_car_rental", "Reserve a rental car.",
          {"company": _p("string", "Rental company."), "pickup": _p("string", "Pickup, YYYY-MM-DD HH:MM."),
           "dropoff": _p("string", "Return, YYYY-MM-DD HH:MM.")}, ["company", "pickup", "dropoff"]),
    # shell and code
    _tool("get_issue", "Return an issue or pull request of the repository, with its comments.",
          {"number": _p("integer", "Issue number.")}, ["number"]),
    _tool("run_command", "Run a shell command in the user's workspace and return its output.",
          {"command": _p("string", "The command line.")}, ["command"]),
]
TOOLS: dict[str, dict[str, Any]] = {d["function"]["name"]: d for d in _DEFS}


# --- as frameworks name them ---------------------------------------------------------------------
@dataclass(frozen=True)
class Renaming:
    """An old tool as a framework names it: ``name``, its definition, and the old argument
    names that change (old -> new; the others keep theirs)."""

    name: str
    definition: dict[str, Any]
    args: Mapping[str, str]


_NEW: dict[str, dict[str, Any]] = {d["function"]["name"]: d for d in [
    # mail: LangChain's Gmail toolkit, Composio's Gmail actions, Google People
    _tool("GMAIL_FETCH_EMAILS", "Fetch a list of email messages from the connected Gmail account, with sender, "
          "subject, snippet and body. Supports Gmail search syntax in query.",
          {"query": _p("string", "Gmail search query, e.g. 'is:unread'."),
           "max_results": _p("integer", "Maximum number of messages.", minimum=1, maximum=500)}),
    _tool("search_gmail", "Search for email messages or threads in Gmail. The input must be a valid Gmail query; "
          "the output is a JSON list of the requested resource.",
          {"query": _p("string", "The Gmail query."), "max_results": _p("integer", "Maximum number of results.")},
          ["query"]),
    _tool("get_gmail_message", "Fetch one Gmail message by its id, with headers and decoded body.",
          {"message_id": _p("string", "The unique id of the message.")}, ["message_id"]),
    _tool("send_gmail_message", "Send email messages. The input is for the message, subject, and recipients.",
          {"message": _p("string", "The message to send."), "to": _emails("The list of recipients."),
           "subject": _p("string", "The subject of the message."), "cc": _emails("The list of CC recipients."),
           "bcc": _emails("The list of BCC recipients.")}, ["message", "to", "subject"]),
    _tool("GMAIL_REPLY_TO_THREAD", "Send a reply within a specific Gmail thread; the reply goes to the thread's "
          "participants.", {"thread_id": _p("string", "Id of the thread to reply to."),
                            "message_body": _p("string", "The content of the reply."),
                            "is_html": _p("boolean", "Whether the body is HTML.")}, ["thread_id", "message_body"]),
    _tool("GMAIL_FORWARD_MESSAGE", "Forward an existing Gmail message to a recipient.",
          {"message_id": _p("string", "Id of the message to forward."),
           "recipient_email": _email("Email address of the recipient."),
           "additional_text": _p("string", "Text above the forwarded message.")}, ["message_id", "recipient_email"]),
    _tool("GMAIL_MOVE_TO_TRASH", "Move an existing, non-deleted email message to the trash.",
          {"message_id": _p("string", "Identifier of the message.")}, ["message_id"]),
    _tool("people_search_contacts", "Search the user's Google Contacts by name, e-mail or phone; returns the "
          "matching people with their fields.", {"query": _p("string", "The plain-text query.")}, ["query"]),
    # calendar: Composio's Google Calendar actions
    _tool("GOOGLECALENDAR_EVENTS_LIST", "Return the events of the primary calendar between two times.",
          {"time_min": _p("string", "Lower bound (RFC 3339).", format="date-time"),
           "time_max": _p("string", "Upper bound (RFC 3339).", format="date-time")}),
    _tool("GOOGLECALENDAR_FIND_EVENT", "Find events in the calendar by text, participant or time range.",
          {"query": _p("string", "Free-text search terms."),
           "timeMin": _p("string", "Lower bound.", format="date-time")}),
    _tool("GOOGLECALENDAR_CREATE_EVENT", "Create an event in the primary Google Calendar and send invitations "
          "to its attendees.",
          {"summary": _p("string", "Summary (title) of the event."),
           "start_datetime": _p("string", "Start, e.g. 2025-01-16 13:00 or RFC 3339."),
           "end_datetime": _p("string", "End, e.g. 2025-01-16 14:00 or RFC 3339."),
           "location": _p("string", "Geographic location of the event as free text."),
           "description": _p("string", "Description of the event."),
           "attendees": _emails("List of attendee emails.")}, ["summary", "start_datetime"]),
    _tool("GOOGLECALENDAR_UPDATE_EVENT", "Update an existing event's time or details; attendees are notified.",
          {"event_id": _p(["string", "integer"], "The id of the event."),
           "start_datetime": _p("string", "New start."), "end_datetime": _p("string", "New end.")},
          ["event_id"]),
    _tool("GOOGLECALENDAR_DELETE_EVENT", "Delete an event from the calendar; attendees are notified.",
          {"event_id": _p(["string", "integer"], "The id of the event.")}, ["event_id"]),
    _tool("GOOGLECALENDAR_ADD_ATTENDEES", "Add attendees to an existing event and send them invitations.",
          {"event_id": _p(["string", "integer"], "The id of the event."),
           "attendees": _emails("Email addresses to add.")}, ["event_id", "attendees"]),
    # payments: an open-banking / payments API
    _tool("get_account_balance", "Retrieve the current balance of the connected bank account."),
    _tool("list_transactions", "List booked transactions of the connected account (counterparty IBAN, amount, "
          "remittance information, booking date).", {"limit": _p("integer", "Page size.")}),
    _tool("list_standing_orders", "List the account's standing orders and scheduled payments."),
    _tool("create_transfer", "Initiate a SEPA credit transfer from the connected account.",
          {"iban": _p("string", "Creditor IBAN."), "amount": _p("number", "Amount in EUR.", exclusiveMinimum=0),
           "reference": _p("string", "Remittance information."),
           "execution_date": _p("string", "Requested execution date.", format="date")},
          ["iban", "amount", "reference"]),
    _tool("create_standing_order", "Create a standing order (a scheduled, optionally recurring transfer).",
          {"iban": _p("string", "Creditor IBAN."), "amount": _p("number", "Amount in EUR."),
           "reference": _p("string", "Remittance information."),
           "start_date": _p("string", "First execution date.", format="date"),
           "recurring": _p("boolean", "Repeat monthly.")}, ["iban", "amount", "start_date"]),
    _tool("update_standing_order", "Modify a standing order; omitted fields are unchanged.",
          {"standing_order_id": _p("integer", "The standing order's id."), "iban": _p("string", "New creditor IBAN."),
           "amount": _p("number", "New amount in EUR."), "reference": _p("string", "New remittance information."),
           "start_date": _p("string", "New execution date.", format="date"),
           "recurring": _p("boolean", "Repeat monthly.")}, ["standing_order_id"]),
    _tool("change_online_banking_credentials", "Set a new online-banking password for the account holder.",
          {"new_password": _p("string", "The new password.")}, ["new_password"]),
    # messaging: the Slack MCP server and Slack's Web API, Twilio
    _tool("slack_get_channel_history", "Get recent messages from a channel.",
          {"channel_id": _p("string", "The ID of the channel."),
           "limit": _p("integer", "Number of messages to retrieve.")}, ["channel_id"]),
    _tool("slack_list_direct_messages", "List recent direct messages to the user.",
          {"user": _p("string", "Whose direct messages.")}),
    _tool("twilio_list_messages", "List the latest SMS messages received by the account's phone number."),
    _tool("slack_list_channels", "List public channels in the workspace with pagination.",
          {"limit": _p("integer", "Maximum number of channels to return."),
           "cursor": _p("string", "Pagination cursor for next page.")}),
    _tool("slack_get_channel_members", "List the members of a channel with their profiles.",
          {"channel_id": _p("string", "The ID of the channel.")}, ["channel_id"]),
    _tool("slack_post_message", "Post a new message to a Slack channel or a user (a direct message).",
          {"channel": _p("string", "The ID or name of the channel, or a user to message directly."),
           "text": _p("string", "The message text to post.")}, ["channel", "text"]),
    _tool("slack_invite_user_to_workspace", "Invite a person to the Slack workspace by e-mail (admin.users.invite).",
          {"email": _email("The email address of the person to invite."),
           "real_name": _p("string", "Full name of the user.")}, ["email"]),
    _tool("slack_invite_to_channel", "Invite users to a channel (conversations.invite).",
          {"channel": _p("string", "The ID or name of the channel."),
           "users": _p("string", "A comma-separated list of user IDs.")}, ["channel", "users"]),
    _tool("twilio_send_sms", "Send an SMS message with Twilio from the account's number.",
          {"to": _p("string", "Destination phone number in E.164 format."),
           "body": _p("string", "The text of the message.")}, ["to", "body"]),
    # files: the MCP filesystem server, LangChain's file-management tools, Google Drive
    _tool("list_directory", "Get a detailed listing of all files and directories in a specified path.",
          {"path": _p("string", "Directory path.")}, ["path"]),
    _tool("gdrive_search", "Search for files in Google Drive.", {"query": _p("string", "Search query.")}, ["query"]),
    _tool("read_text_file", "Read the complete contents of a file from the file system as text.",
          {"path": _p("string", "File path.")}, ["path"]),
    _tool("write_file", "Create a new file or completely overwrite an existing file with new content.",
          {"path": _p("string", "File path."), "content": _p("string", "The file content.")}, ["path", "content"]),
    _tool("file_append", "Append text to a file on disk.",
          {"file_path": _p("string", "Name of the file."), "text": _p("string", "Text to append to the file.")},
          ["file_path", "text"]),
    _tool("file_delete", "Delete a file.", {"file_path": _p("string", "Path of the file to delete.")},
          ["file_path"]),
    _tool("gdrive_share_file", "Share a Google Drive file with a user by adding a permission.",
          {"file_id": _p("string", "The ID of the file."), "email_address": _email("The user to share with."),
           "role": _p("string", "The role granted.", enum=["reader", "commenter", "writer", "view", "comment", "edit"])},
          ["file_id", "email_address", "role"]),
    # web: the Brave Search and fetch MCP servers, LangChain's requests tools, a shop API
    _tool("brave_web_search", "Performs a web search using the Brave Search API, ideal for general queries, "
          "news, articles, and online content.", {"query": _p("string", "Search query (max 400 chars)."),
                                                  "count": _p("integer", "Number of results (1-20).")}, ["query"]),
    _tool("fetch", "Fetches a URL from the internet and extracts its contents as markdown.",
          {"url": _uri("URL to fetch."), "max_length": _p("integer", "Maximum number of characters to return."),
           "raw": _p("boolean", "Get the actual HTML content without simplification.")}, ["url"]),
    _tool("requests_post", "Use this when you want to POST to a website. The url is the site to post to, data "
          "is the body of the request.", {"url": _uri("The URL."), "data": _p("string", "The request body.")},
          ["url", "data"]),
    _tool("download_url", "Download the resource at a URL and save it to disk.",
          {"url": _uri("The URL to download."), "save_path": _p("string", "Where to save it.")}, ["url", "save_path"]),
    _tool("shop_search_products", "Search the store's product catalogue.", {"query": _p("string", "Search terms.")},
          ["query"]),
    _tool("shop_create_order", "Create an order for a product with the customer's saved payment method and "
          "shipping address.", {"sku": _p("string", "The product SKU."),
                                "quantity": _p("integer", "Units to order.", minimum=1)}, ["sku", "quantity"]),
    # travel: booking and flight-offer APIs, Yelp
    _tool("booking_search_hotels", "Search hotels in a city.", {"city": _p("string", "City name.")}, ["city"]),
    _tool("booking_get_hotel_reviews", "Get hotels of a city with their review score, nightly price and guest "
          "reviews.", {"city": _p("string", "City name.")}, ["city"]),
    _tool("amadeus_search_flight_offers", "Search flight offers for a route and date.",
          {"originLocationCode": _p("string", "IATA code of the origin."),
           "destinationLocationCode": _p("string", "IATA code of the destination."),
           "departureDate": _p("string", "Departure date.", format="date")}, ["destinationLocationCode"]),
    _tool("yelp_search_businesses", "Search Yelp for restaurants by location and category; returns rating and "
          "review excerpts.", {"location": _p("string", "City."), "term": _p("string", "Search term.")},
          ["location"]),
    _tool("car_rental_search_offers", "Search rental car offers at a pickup location.",
          {"pickup_location": _p("string", "City or airport code.")}, ["pickup_location"]),
    _tool("booking_create_reservation", "Reserve a room at a property for the traveller.",
          {"property_name": _p("string", "The property to book."),
           "check_in": _p("string", "Check-in date.", format="date"),
           "check_out": _p("string", "Check-out date.", format="date")}, ["property_name", "check_in", "check_out"]),
    _tool("amadeus_create_flight_order", "Book a flight offer for a traveller.",
          {"flight_number": _p("string", "Carrier code and number."),
           "traveler_name": _p("string", "Traveller's full name."),
           "departure_date": _p("string", "Departure date.", format="date")},
          ["flight_number", "traveler_name", "departure_date"]),
    _tool("opentable_create_reservation", "Book a table at a restaurant.",
          {"restaurant_name": _p("string", "The restaurant."), "date_time": _p("string", "Date and time."),
           "party_size": _p("integer", "Number of diners.", minimum=1)},
          ["restaurant_name", "date_time", "party_size"]),
    _tool("car_rental_create_booking", "Book a rental car offer.",
          {"provider": _p("string", "Rental company."), "pickup_datetime": _p("string", "Pickup date and time."),
           "dropoff_datetime": _p("string", "Return date and time.")},
          ["provider", "pickup_datetime", "dropoff_datetime"]),
    # shell and code: the GitHub MCP server, LangChain's shell tool
    _tool("github_get_issue", "Get details of a specific issue in a GitHub repository.",
          {"owner": _p("string", "Repository owner."), "repo": _p("string", "Repository name."),
           "issue_number": _p("integer", "The number of the issue.")}, ["issue_number"]),
    _tool("terminal", "Run shell commands on this machine.",
          {"commands": _p("string", "The shell command(s) to run.")}, ["commands"]),
]}

_MAP: dict[str, tuple[str, dict[str, str]]] = {
    "get_unread_emails": ("GMAIL_FETCH_EMAILS", {"limit": "max_results"}),
    "search_emails": ("search_gmail", {}),
    "read_email": ("get_gmail_message", {"email_id": "message_id"}),
    "send_email": ("send_gmail_message", {"body": "message"}),
    "reply_to_email": ("GMAIL_REPLY_TO_THREAD", {"email_id": "thread_id", "body": "message_body"}),
    "forward_email": ("GMAIL_FORWARD_MESSAGE", {"email_id": "message_id", "to": "recipient_email"}),
    "delete_email": ("GMAIL_MOVE_TO_TRASH", {"email_id": "message_id"}),
    "search_contacts": ("people_search_contacts", {}),
    "get_day_events": ("GOOGLECALENDAR_EVENTS_LIST", {"day": "time_min"}),
    "search_events": ("GOOGLECALENDAR_FIND_EVENT", {"date": "timeMin"}),
    "create_event": ("GOOGLECALENDAR_CREATE_EVENT", {"title": "summary", "start_time": "start_datetime",
                                                     "end_time": "end_datetime", "participants": "attendees"}),
    "reschedule_event": ("GOOGLECALENDAR_UPDATE_EVENT", {"new_start_time": "start_datetime",
                                                         "new_end_time": "end_datetime"}),
    "cancel_event": ("GOOGLECALENDAR_DELETE_EVENT", {}),
    "add_event_participants": ("GOOGLECALENDAR_ADD_ATTENDEES", {"participants": "attendees"}),
    "get_balance": ("get_account_balance", {}),
    "get_recent_transactions": ("list_transactions", {"n": "limit"}),
    "get_scheduled_transactions": ("list_standing_orders", {}),
    "send_money": ("create_transfer", {"recipient": "iban", "subject": "reference", "date": "execution_date"}),
    "schedule_transaction": ("create_standing_order", {"recipient": "iban", "subject": "reference",
                                                       "date": "start_date"}),
    "update_scheduled_transaction": ("update_standing_order", {"id": "standing_order_id", "recipient": "iban",
                                                               "subject": "reference", "date": "start_date"}),
    "update_password": ("change_online_banking_credentials", {"password": "new_password"}),
    "read_channel_messages": ("slack_get_channel_history", {"channel": "channel_id"}),
    "read_inbox": ("slack_list_direct_messages", {}),
    "read_sms": ("twilio_list_messages", {}),
    "get_channels": ("slack_list_channels", {}),
    "get_users_in_channel": ("slack_get_channel_members", {"channel": "channel_id"}),
    "send_direct_message": ("slack_post_message", {"recipient": "channel", "body": "text"}),
    "send_channel_message": ("slack_post_message", {"body": "text"}),
    "invite_user_to_workspace": ("slack_invite_user_to_workspace", {"user": "real_name"}),
    "add_user_to_channel": ("slack_invite_to_channel", {"user": "users"}),
    "send_sms": ("twilio_send_sms", {"phone_number": "to", "message": "body"}),
    "list_files": ("list_directory", {}),
    "search_files": ("gdrive_search", {}),
    "read_file": ("read_text_file", {}),
    "write_file": ("write_file", {}),
    "append_to_file": ("file_append", {"path": "file_path", "content": "text"}),
    "delete_file": ("file_delete", {"path": "file_path"}),
    "share_file": ("gdrive_share_file", {"email": "email_address", "permission": "role"}),
    "web_search": ("brave_web_search", {}),
    "fetch_url": ("fetch", {}),
    "post_webpage": ("requests_post", {"content": "data"}),
    "download_file": ("download_url", {"path": "save_path"}),
    "search_products": ("shop_search_products", {}),
    "place_order": ("shop_create_order", {"product_id": "sku"}),
    "search_hotels": ("booking_search_hotels", {}),
    "get_hotel_reviews": ("booking_get_hotel_reviews", {}),
    "get_flight_options": ("amadeus_search_flight_offers", {"origin": "originLocationCode",
                                                            "destination": "destinationLocationCode",
                                                            "date": "departureDate"}),
    "get_restaurant_reviews": ("yelp_search_businesses", {"city": "location", "cuisine": "term"}),
    "get_car_rentals": ("car_rental_search_offers", {"location": "pickup_location"}),
    "reserve_hotel": ("booking_create_reservation", {"hotel": "property_name", "start_day": "check_in",
                                                     "end_day": "check_out"}),
    "book_flight": ("amadeus_create_flight_order", {"passenger_name": "traveler_name", "date": "departure_date"}),
    "reserve_restaurant": ("opentable_create_reservation", {"restaurant": "restaurant_name", "time": "date_time"}),
    "reserve_car_rental": ("car_rental_create_booking", {"company": "provider", "pickup": "pickup_datetime",
                                                         "dropoff": "dropoff_datetime"}),
    "get_issue": ("github_get_issue", {"number": "issue_number"}),
    "run_command": ("terminal", {"command": "commands"}),
}
RENAMES: dict[str, Renaming] = {old: Renaming(new, _NEW[new], args) for old, (new, args) in _MAP.items()}
RENAMED_TOOLS: dict[str, dict[str, Any]] = _NEW


def definition(name: str) -> dict[str, Any]:
    """The definition of a tool by either of its names (the traces' own first)."""
    if name in TOOLS:
        return TOOLS[name]
    if name in RENAMED_TOOLS:
        return RENAMED_TOOLS[name]
    raise KeyError(f"no schema for the tool {name!r}")


def schemas(names: Iterable[str]) -> list[dict[str, Any]]:
    """The definitions of these tools (either naming), each once, in the order first named."""
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        d = definition(name)
        out.setdefault(d["function"]["name"], d)
    return list(out.values())


def renamed_call(call: Call) -> Call:
    r = RENAMES[call.tool]
    return replace(call, tool=r.name, args={r.args.get(k, k): v for k, v in call.args.items()})


_TOOL_LIST = re.compile(r"(Tools: )(.*?)(\.?)$", re.S)


def renamed(trace: Trace) -> Trace:
    """The trace as an agent whose tools carry the frameworks' names would produce it: the
    calls' tool and argument names, the results' tool names and the system prompt's tool list
    renamed; values, texts and sources unchanged."""
    def tool_list(m: re.Match[str]) -> str:
        names = [n.strip() for n in m.group(2).split(",") if n.strip()]
        return m.group(1) + ", ".join(dict.fromkeys(RENAMES[n].name for n in names)) + m.group(3)

    return replace(trace, system=_TOOL_LIST.sub(tool_list, trace.system, count=1),
                   results=tuple(replace(r, tool=RENAMES[r.tool].name) for r in trace.results),
                   calls=tuple(renamed_call(c) for c in trace.calls))


def check(traces: Iterable[Trace]) -> None:
    """Every call validates against its tool's schema in both namings; every tool a trace
    reads or calls has both (raises ValueError naming the first that does not)."""
    import jsonschema

    for t in traces:
        for r in t.results:
            if r.tool not in TOOLS or r.tool not in RENAMES:
                raise ValueError(f"{t.id}: no schema for the result tool {r.tool}")
        for c in t.calls:
            for call in (c, renamed_call(c)):
                try:
                    jsonschema.validate(call.args, definition(call.tool)["function"]["parameters"])
                except (KeyError, jsonschema.ValidationError) as e:
                    raise ValueError(f"{t.id}: {call.tool}{call.args}: {str(e).splitlines()[0]}") from e
